"""A profiling request's parameters that would not take effect (``ProfileRequest.check_options``): one no
requested probe's pass reads, one of another mode; and what every request refuses before any file is read
or written (``check_profile_run``): ``resume`` with ``force``, a ``name`` that is not a plain file-name
stem."""

from __future__ import annotations

from typing import ClassVar

import pytest

from headprobe import HeadprobeError, ProfileRequest, RetentionConfig, StopRule
from headprobe.errors import flag_spelling
from headprobe.probes import registry
from headprobe.probes.pass_steps import PassSteps
from headprobe.probes.plan import check_profile_run

NEEDLE_PROBES = "the retrieval, enhanced_retrieval or retrieval_reasoning probes only"
#: Parameters the passes over a user's examples read too.
HEAD_PROBES = ("the retrieval, enhanced_retrieval, retrieval_reasoning, context_retrieval, context_enhanced_retrieval "
               "or query_focus probes only")


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "fast", "recompute_share": 0.5}, "recompute_share: applies in mode='reuse' only, not mode='fast'"),
    ({"mode": "reference", "batch_size": 8}, "batch_size: applies in mode='fast' only, not mode='reference'"),
    ({"mode": "reuse", "split_attention": False}, "split_attention: applies in mode='fast' only, not mode='reuse'"),
    ({"probes": ["retrieval"], "gate": "likelihood"},
     "gate: applies to the retrieval_reasoning probe only, and none is requested (probes='retrieval')"),
    ({"probes": ["retrieval"], "tasks": ["code"]},
     "tasks: applies to the layer_retention probe only, and none is requested (probes='retrieval')"),
    ({"probes": ["retrieval"], "samples_per_task": 2}, "samples_per_task: applies to the layer_retention probe only"),
    ({"probes": ["retrieval"], "retention": RetentionConfig(max_tokens=512)},
     "retention: applies to the layer_retention probe only"),
    ({"probes": ["layer_retention"], "lengths": [300]},
     f"lengths: applies to {NEEDLE_PROBES}, and none is requested (probes='layer_retention')"),
    ({"probes": ["layer_retention"], "depths": [0.5]}, f"depths: applies to {NEEDLE_PROBES}"),
    ({"probes": ["layer_retention"], "seeds": [1]}, f"seeds: applies to {NEEDLE_PROBES}"),
    ({"probes": ["layer_retention"], "needle_ids": ["r01"]}, f"needle_ids: applies to {NEEDLE_PROBES}"),
    ({"probes": ["layer_retention"], "haystack": "book.txt"}, f"haystack: applies to {NEEDLE_PROBES}"),
    ({"probes": ["layer_retention"], "group_reduction": "max"}, f"group_reduction: applies to {HEAD_PROBES}"),
    ({"probes": ["layer_retention"], "until_stable": StopRule()}, f"until_stable: applies to {HEAD_PROBES}"),
])
def test_parameters_that_would_not_take_effect_are_refused(kwargs, message):
    request = ProfileRequest(**{"probes": ["retrieval", "retrieval_reasoning"], **kwargs})
    with pytest.raises(HeadprobeError) as err:
        request.check_options()                                 # the parameters set to other than their defaults
    assert str(err.value).startswith(message)
    given = [name for name in kwargs if name not in ("probes", "mode")]
    with pytest.raises(HeadprobeError) as err:
        ProfileRequest(**{"probes": ["retrieval", "retrieval_reasoning"], **kwargs}).check_options(given)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("kwargs, message", [
    ({"resume": True, "force": True}, ("resume=True with force=True: choose one (resume=True continues the logs, "
                                      "force=True starts them over)")),
    ({"name": "../../escape"}, ("name='../../escape': expected a plain file-name stem (no path separator or NUL "
                               "character); the files go in out_dir")),
    ({"name": "sub\\name"}, "name='sub\\\\name': expected a plain file-name stem"),
    ({"name": ""}, "name='': expected a file-name stem, found nothing"),
])
def test_every_request_refuses_contradictions_and_names_that_leave_the_folder(kwargs, message, tmp_path):
    request = ProfileRequest(**{"probes": ["retrieval"], **kwargs, "out_dir": tmp_path / "out"})
    with pytest.raises(HeadprobeError) as err:
        check_profile_run(request, "smollm2-135m")
    assert str(err.value).startswith(message)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kwargs", [
    {"mode": "reuse", "recompute_share": 0.5}, {"mode": "fast", "batch_size": 8, "split_attention": False},
    {"probes": ["retrieval_reasoning"], "gate": "likelihood"}, {"probes": ["layer_retention"], "tasks": ["code"]},
    {"probes": ["retrieval", "layer_retention"], "lengths": [300], "tasks": ["code"]},
    {"probes": ["retrieval"], "seeds": [0, 1], "group_reduction": "max", "until_stable": StopRule()},
    {"name": "my-run.v2"},
])
def test_parameters_that_apply_are_accepted(kwargs, tmp_path):
    request = ProfileRequest(**{"probes": ["retrieval"], **kwargs, "out_dir": tmp_path})
    request.check_options()
    request.check_options([name for name in kwargs if name not in ("probes", "mode")])
    plan = check_profile_run(request, "smollm2-135m")
    assert plan.request.probes == tuple(request.probes)


def test_a_program_may_build_requests_from_one_set_of_values(tmp_path):
    # check_profile_run leaves unused parameters to check_options: one set of values for every mode
    for mode in ("fast", "reference", "reuse"):
        request = ProfileRequest(probes=["retrieval"], mode=mode, batch_size=1, recompute_share=0.5, out_dir=tmp_path)
        assert check_profile_run(request, "smollm2-135m").request.mode == mode


def test_given_parameters_are_checked_even_at_their_defaults():
    # the command line passes the flags typed: --mode fast --batch-size 4 is fine, --mode reference --batch-size 4
    # (the default value, typed) would not take effect
    ProfileRequest(probes=["retrieval"], batch_size=4).check_options({"batch_size"})
    reference = ProfileRequest(probes=["retrieval"], mode="reference", batch_size=4)
    reference.check_options()                                   # at its default: not set
    with pytest.raises(HeadprobeError, match=r"^batch_size: applies in mode='fast' only"):
        reference.check_options({"batch_size"})
    # gate "auto" and "published" only choose for a pass that takes the gate, so they are not "set"; typed, they
    # would not take effect without retrieval_reasoning
    for gate in ("auto", "published"):
        ProfileRequest(probes=["retrieval"], gate=gate).check_options()
        with flag_spelling({"probes": "--probe"}), pytest.raises(HeadprobeError) as err:
            ProfileRequest(probes=["retrieval"], gate=gate).check_options({"gate"})
        assert str(err.value) == ("--gate: applies to the retrieval_reasoning probe only, and none is requested "
                                  "(--probe retrieval)")


class _Undeclared(PassSteps):
    kinds = ("toy_undeclared",)
    runners: ClassVar = {"fast": None}


def test_a_pass_that_does_not_say_what_it_reads_refuses_nothing():
    registry.register_pass(registry.ProbePass("undeclared", ("toy_undeclared",), "head_scores", _Undeclared()))
    try:
        ProfileRequest(probes=["toy_undeclared"], tasks=["code"], lengths=[300], gate="likelihood").check_options()
        with pytest.raises(HeadprobeError, match="recompute_share: applies in mode='reuse' only"):
            ProfileRequest(probes=["toy_undeclared"], recompute_share=0.5).check_options()
    finally:
        registry.unregister_pass("undeclared")
