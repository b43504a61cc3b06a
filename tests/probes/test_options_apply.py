"""A profiling request refuses parameters that would not take effect (``ProfileRequest.check_options``):
one no requested probe's pass reads, one of another mode, ``resume`` with ``force``, and a ``name`` that
is not a plain file-name stem; all before any file is read or written."""

from __future__ import annotations

from typing import ClassVar

import pytest

from headprobe import HeadprobeError, ProfileRequest, RetentionConfig, StopRule
from headprobe.errors import flag_spelling
from headprobe.probes import registry
from headprobe.probes.pass_steps import PassSteps
from headprobe.probes.plan import check_profile_run

NEEDLE_PROBES = "the retrieval, enhanced_retrieval or retrieval_reasoning probes only"


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
    ({"probes": ["layer_retention"], "grid": "full"}, f"grid: applies to {NEEDLE_PROBES}"),
    ({"probes": ["layer_retention"], "needle_ids": ["r01"]}, f"needle_ids: applies to {NEEDLE_PROBES}"),
    ({"probes": ["layer_retention"], "haystack": "book.txt"}, f"haystack: applies to {NEEDLE_PROBES}"),
    ({"probes": ["layer_retention"], "group_reduction": "max"}, f"group_reduction: applies to {NEEDLE_PROBES}"),
    ({"probes": ["layer_retention"], "until_stable": StopRule()}, f"until_stable: applies to {NEEDLE_PROBES}"),
    ({"resume": True, "force": True}, ("resume=True with force=True: choose one (resume=True continues the logs, "
                                      "force=True starts them over)")),
    ({"name": "../../escape"}, ("name='../../escape': expected a plain file-name stem (no path separator or NUL "
                               "character); the files go in out_dir")),
    ({"name": "sub\\name"}, "name='sub\\\\name': expected a plain file-name stem"),
    ({"name": ""}, "name='': expected a file-name stem, found nothing"),
])
def test_parameters_that_would_not_take_effect_are_refused(kwargs, message, tmp_path):
    request = ProfileRequest(**{"probes": ["retrieval", "retrieval_reasoning"], **kwargs,
                                "out_dir": tmp_path / "out"})
    with pytest.raises(HeadprobeError) as err:
        check_profile_run(request, "smollm2-135m")
    assert str(err.value).startswith(message)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kwargs", [
    {"mode": "reuse", "recompute_share": 0.5}, {"mode": "fast", "batch_size": 8, "split_attention": False},
    {"probes": ["retrieval_reasoning"], "gate": "likelihood"}, {"probes": ["retrieval"], "gate": "auto"},
    {"probes": ["retrieval"], "gate": "published"}, {"probes": ["layer_retention"], "tasks": ["code"]},
    {"probes": ["retrieval", "layer_retention"], "lengths": [300], "tasks": ["code"]},
    {"probes": ["retrieval"], "seeds": [0, 1], "group_reduction": "max", "until_stable": StopRule()},
    {"name": "my-run.v2"},
])
def test_parameters_that_apply_are_accepted(kwargs, tmp_path):
    request = ProfileRequest(**{"probes": ["retrieval"], **kwargs, "out_dir": tmp_path})
    plan = check_profile_run(request, "smollm2-135m")
    assert plan.request.probes == tuple(request.probes)


def test_given_parameters_are_checked_even_at_their_defaults():
    # the command line passes the flags typed: --mode fast --batch-size 4 is fine, --mode reference --batch-size 4
    # (the default value, typed) would not take effect
    ProfileRequest(probes=["retrieval"], batch_size=4).check_options({"batch_size"})
    reference = ProfileRequest(probes=["retrieval"], mode="reference", batch_size=4)
    reference.check_options()                                   # at its default: not set
    with pytest.raises(HeadprobeError, match=r"^batch_size: applies in mode='fast' only"):
        reference.check_options({"batch_size"})
    with flag_spelling({"probes": "--probe"}), pytest.raises(HeadprobeError) as err:
        ProfileRequest(probes=["retrieval"]).check_options({"gate"})
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
