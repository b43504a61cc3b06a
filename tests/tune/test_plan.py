"""The trial plan: the most trials each tune stage can spend, as the races spend them."""

from __future__ import annotations

import pytest

from headprobe.tune.plan import TrialPlan, race_trials


@pytest.mark.parametrize(("candidates", "sizes", "eta", "cells", "want"), [
    (28, [1, 3], 3, 6, 28 * 1 * 6 + 10 * 2 * 6),          # 168 on rung 0, then 10 candidates on 2 new items
    (191, [1, 3], 3, 6, 191 * 6 + 64 * 2 * 6),
    (9, [1, 3, 9], 3, 1, 9 + 3 * 2 + 1 * 6),
    (5, [1], 3, 4, 20),
    (0, [1, 3], 3, 6, 0),
])
def test_race_trials_by_hand(candidates, sizes, eta, cells, want):
    assert race_trials(candidates, sizes, eta, cells) == want


def test_plan_total_and_record():
    plan = TrialPlan(selection=228, allocation=1530, holdout=96, rungs=[1, 3], cells=6)
    assert plan.total == 1854 and plan.to_json()["total"] == 1854
    assert plan.describe().startswith("at most 1854 trials: selection 228, allocation 1530, held-out 96")
