"""A request is immutable, checked once before the model loads, and resolved once on the model: the grid by
device and context, the gate by model size, the prompts against the tokenizer."""

from __future__ import annotations

import dataclasses

import pytest

from headprobe import HeadprobeError, ProfileRequest, run_profile
from headprobe.probes import plan as plan_module
from headprobe.probes.plan import check_profile_run
from headprobe.probes.trial_grid import CPU_DEPTHS, CPU_LENGTHS


def test_a_request_is_immutable():
    request = ProfileRequest(probes=["retrieval"], lengths=[300, 600], depths=[0.5], needle_ids=["r01"])
    assert (request.probes, request.lengths, request.needle_ids) == (("retrieval",), (300, 600), ("r01",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.lengths = [100]  # type: ignore[misc]


def test_a_run_is_checked_once(tiny_llama, tmp_path, monkeypatch):
    calls = []
    real = plan_module.check_request
    monkeypatch.setattr(plan_module, "check_request", lambda request: calls.append(1) or real(request))
    request = ProfileRequest(probes=["retrieval"], lengths=[300], depths=[0.5], needle_ids=["r01"],
                             chat_template=False, out_dir=tmp_path / "a")
    plan = check_profile_run(request, tiny_llama.identity.name)            # as the command line does
    run_profile(tiny_llama, plan.resolve(tiny_llama))
    run_profile(tiny_llama, dataclasses.replace(request, out_dir=tmp_path / "b"))   # a request: checked here
    assert len(calls) == 2


def test_the_grid_is_resolved_on_the_model(tiny_llama, tmp_path):
    def grid(**kw):
        request = ProfileRequest(probes=["retrieval"], needle_ids=["r01"], chat_template=False, out_dir=tmp_path,
                                 **kw)
        return check_profile_run(request, tiny_llama.identity.name).resolve(tiny_llama).grid

    cpu = grid()                                              # auto on the CPU: the CPU grid
    assert (cpu.lengths, cpu.depths) == (CPU_LENGTHS, CPU_DEPTHS) and cpu.description.startswith("CPU grid")
    full = grid(grid="full")               # HeadKV's 5 lengths, evenly from 1000 to the tiny model's 4096 tokens
    assert tiny_llama.identity.max_context == 4096
    assert full.lengths == (1000, 1774, 2548, 3322, 4096) and len(full.depths) == 10
    custom = grid(lengths=[300], depths=[0.25])
    assert (custom.lengths, custom.depths, custom.description) == ((300,), (0.25,), "custom lengths, custom depths")


def test_the_gate_is_chosen_once_and_recorded(tiny_llama, tmp_path):
    request = ProfileRequest(probes=["retrieval", "retrieval_reasoning"], lengths=[300], depths=[0.5],
                             needle_ids=["r01", "q01"], chat_template=False, gate="auto", out_dir=tmp_path)
    retrieval, reasoning = check_profile_run(request, tiny_llama.identity.name).resolve(tiny_llama).passes
    assert retrieval.gate is None and retrieval.settings["gate"] == "published"
    assert reasoning.gate.gate == "likelihood" and reasoning.gate.describe().startswith("likelihood (auto: ")
    assert reasoning.settings["gate_auto"]["parameters"] == reasoning.gate.parameters > 0


def test_a_plan_runs_only_on_the_model_it_was_checked_for(tiny_llama, tmp_path):
    request = ProfileRequest(probes=["retrieval"], lengths=[300], depths=[0.5], out_dir=tmp_path)
    plan = check_profile_run(request, "someone/other-model")
    with pytest.raises(HeadprobeError, match="the run was checked for someone/other-model, whose files are named "
                                             r"other-model\.\*"):
        plan.resolve(tiny_llama)
    assert not list(tmp_path.iterdir())
