"""The candidates and budgets the check makes before the model loads are the run's: each candidate is made
once and each budget resolved once per tune; a check made for another model is not taken."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import torch
from tune.synthetic_scores import install
from tune.test_runner import tiny_request

from headprobe.tune.candidates import CandidatePool, tune_profiles
from headprobe.tune.runner import run_tune
from headprobe.tune.space_check import ShapeOnly, check_tune_space

torch.set_num_threads(1)


def test_the_run_takes_what_the_check_made_before_the_load(tiny_llama, tmp_path, monkeypatch):
    from headprobe.eval import runner

    install(monkeypatch)
    resolved: Counter = Counter()
    original = runner.resolve_budget

    def counted(lm, setting, profile_dirs=None, window=None):
        resolved[(setting.label, window)] += 1
        return original(lm, setting, profile_dirs, window)

    monkeypatch.setattr(runner, "resolve_budget", counted)
    request = tiny_request(capacities=(16,))
    shape = ShapeOnly(replace(tiny_llama.identity))           # an equal identity, not the loaded model's own
    pool = check_tune_space(shape, request, tune_profiles(shape.identity))
    checked = set(pool.budgets)
    assert checked and pool.serves(tiny_llama, request.space, request.profile_dirs)
    before = Counter(resolved)
    outcome = run_tune(tiny_llama, request, tmp_path / "tune.json", candidates=pool)
    assert all(n == 1 for n in resolved.values())                 # each budget resolved once per tune
    assert not {label for label, _ in resolved - before} & checked  # none the check resolved is resolved again
    made = pool.selection_stage(16)
    assert all(any(c is m for m in made) for c in outcome.stage1[0].candidates)


def test_a_check_made_for_another_model_is_not_taken(tiny_llama):
    request = tiny_request(capacities=(16,))
    other = CandidatePool(replace(tiny_llama.identity, num_layers=tiny_llama.identity.num_layers + 1),
                          request.space, request.profile_dirs, {})
    assert not other.serves(tiny_llama, request.space, request.profile_dirs)
    same = CandidatePool(tiny_llama.identity, request.space, request.profile_dirs, {})
    assert same.serves(tiny_llama, request.space, request.profile_dirs)
    assert not same.serves(tiny_llama, replace(request.space, keep_selections=2), request.profile_dirs)
