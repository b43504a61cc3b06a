"""The rule that drops candidates: rung sizes, ranking, the race, and that it keeps the true best."""

import numpy as np
import pytest

from headprobe import HeadprobeError
from headprobe.tune.halving import HalvingRule, bootstrap_means, rank_rung, rung_items

RULE = HalvingRule(eta=3, level=0.9, resamples=500, seed=0)


def test_rung_items_grow_by_eta_up_to_every_item():
    assert rung_items(1, 3) == [1]
    assert rung_items(2, 3) == [1, 2]
    assert rung_items(3, 3) == [1, 3]
    assert rung_items(8, 3) == [1, 3, 8]
    assert rung_items(27, 3) == [1, 3, 9, 27]
    assert rung_items(10, 2) == [1, 2, 3, 5, 10]
    with pytest.raises(HeadprobeError, match="no calibration items"):
        rung_items(0, 3)


@pytest.mark.parametrize("kwargs, message", [
    ({"eta": 1}, "eta=1: expected an integer of 2 or more"),
    ({"level": 1.5}, "level=1.5: expected a coverage between 0 and 1"),
    ({"resamples": 10}, "resamples=10: expected 100 or more"),
])
def test_bad_rules_are_refused(kwargs, message):
    with pytest.raises(HeadprobeError, match=message):
        HalvingRule(**kwargs)


def test_ranking_keeps_the_top_third_and_says_why_the_rest_went():
    labels = [f"c{i}" for i in range(6)]
    # six candidates whose trial scores differ trial by trial, with means close enough that no difference is
    # real: 11/20, 10/20, ..., 6/20 successes in a fixed random order each
    rng = np.random.default_rng(1)
    scores = np.array([rng.permutation([1.0] * (11 - i) + [0.0] * (9 + i)) for i in range(6)])
    standings = rank_rung(labels, scores, RULE, last=False)
    assert [s.label for s in standings] == labels
    assert [s.rank for s in standings] == [1, 2, 3, 4, 5, 6]
    assert [s.kept for s in standings] == [True, True, False, False, False, False]
    assert standings[0].diff == (0.0, 0.0) and standings[0].reason == ""
    assert standings[2].reason == "below the top 2 of 6 (rank 3)"
    for s, row in zip(standings, scores):
        assert s.mean == pytest.approx(row.mean())
        assert s.interval[0] <= s.mean <= s.interval[1]


def test_a_clearly_worse_candidate_is_dropped_even_inside_the_top_share():
    scores = np.array([[1.0] * 12, [0.0] * 12, [0.0] * 12])
    standings = rank_rung(["good", "bad", "worse"], scores, RULE, last=False, bytes_={"bad": 1.0, "worse": 2.0})
    assert [s.label for s in standings] == ["good", "bad", "worse"]
    assert standings[0].kept and not standings[1].kept
    assert standings[1].reason.startswith("clearly worse than good: difference [-1.000, -1.000] at 90%")


def test_ties_are_broken_by_bytes_then_label_and_the_last_rung_chooses_one():
    scores = np.zeros((3, 5))
    standings = rank_rung(["b", "a", "c"], scores, RULE, last=True, bytes_={"a": 10.0, "b": 10.0, "c": 5.0})
    assert [s.label for s in standings] == ["c", "a", "b"]
    assert [s.kept for s in standings] == [True, False, False]


def test_standings_do_not_depend_on_the_order_of_candidates():
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 2, size=(7, 30)).astype(float)
    labels = [f"s{i}" for i in range(7)]
    first = rank_rung(labels, scores, RULE, last=False)
    perm = rng.permutation(7)
    second = rank_rung([labels[i] for i in perm], scores[perm], RULE, last=False)
    assert [s.to_json() for s in first] == [s.to_json() for s in second]


def test_the_bootstrap_is_paired_and_seeded():
    scores = np.array([[0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0]])
    boot = bootstrap_means(scores, RULE)
    assert boot.shape == (500, 2)
    assert np.array_equal(boot[:, 0], boot[:, 1])        # the same resample for both: their difference is 0
    assert np.array_equal(boot, bootstrap_means(scores, RULE))


def _race(means: np.ndarray, rng: np.random.Generator, trials_per_item: int, items: int, rule: HalvingRule):
    """Successive halving over Bernoulli trials of known means; returns (chosen, dropped, full-evaluation best)."""
    scores = (rng.random((len(means), items * trials_per_item)) < means[:, None]).astype(float)
    labels = [f"c{i:02d}" for i in range(len(means))]
    alive = list(range(len(means)))
    dropped = set()
    sizes = rung_items(items, rule.eta)
    for r, m in enumerate(sizes):
        sub = scores[alive][:, :m * trials_per_item]
        standings = rank_rung([labels[i] for i in alive], sub, rule, last=r == len(sizes) - 1)
        kept = {s.label for s in standings if s.kept}
        dropped |= {labels[i] for i in alive if labels[i] not in kept}
        alive = [i for i in alive if labels[i] in kept]
    full = rank_rung(labels, scores, rule, last=True)[0].label
    return labels[alive[0]], dropped, full


@pytest.mark.parametrize("seed", range(40))
def test_early_dropping_never_drops_the_candidate_a_full_evaluation_ranks_first(seed):
    """27 candidates, one clearly best (0.85 against at most 0.45): on every seed the race keeps it to the end
    and chooses it, as evaluating every candidate on every trial does."""
    rng = np.random.default_rng(seed)
    means = rng.uniform(0.05, 0.45, size=27)
    best = int(rng.integers(27))
    means[best] = 0.85
    chosen, dropped, full = _race(means, rng, trials_per_item=6, items=9, rule=RULE)
    assert full == f"c{best:02d}"
    assert full not in dropped
    assert chosen == full


def test_halving_costs_less_than_a_full_evaluation():
    """The trials a race runs: n·t0 + n/3·3t0 + n/9·9t0 ..., against n·T for every candidate on every trial."""
    n, per_item, items = 27, 6, 9
    sizes = rung_items(items, 3)
    alive, trials = n, 0
    previous = 0
    for m in sizes:
        trials += alive * (m - previous) * per_item       # the new items of the rung, for the candidates left
        previous = m
        alive = max(1, -(-alive // 3))
    assert trials == 27 * 6 + 9 * 12 + 3 * 36           # 162 + 108 + 108
    assert trials < n * items * per_item / 3
