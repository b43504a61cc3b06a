"""Bootstrap intervals and top-k stability; the spread trial order; the intervals block of a profile."""

from __future__ import annotations

import numpy as np
import pytest

import headprobe
from headprobe import FileFormatError
from headprobe.probes.aggregate import needle_profile
from headprobe.probes.bootstrap import BootstrapSettings, head_intervals, resample_means, top_k_jaccard
from headprobe.probes.trial_grid import FULL_DEPTHS, make_grid
from headprobe.probes.trial_order import spread_order


def test_resamples_draw_every_trial_count_once_per_draw():
    scores = np.arange(12, dtype=np.float64).reshape(6, 2, 1)
    means = resample_means(scores, BootstrapSettings(resamples=500, seed=3))
    assert means.shape == (500, 2, 1)
    assert means.min() >= 0 and means[:, 1].max() <= 11               # means of values the trials hold
    np.testing.assert_allclose(means.mean(axis=0), scores.mean(axis=0), atol=0.2)


def test_intervals_cover_the_mean_with_the_normal_width():
    rng = np.random.default_rng(0)
    scores = rng.normal(1.0, 2.0, size=(400, 3, 4))
    low, high = head_intervals(scores, BootstrapSettings(resamples=2000, level=0.9))
    mean = scores.mean(axis=0)
    assert (low < mean).all() and (mean < high).all()
    expected = 2 * 1.645 * scores.std(axis=0) / np.sqrt(400)       # normal approximation of a 90% interval
    np.testing.assert_allclose(high - low, expected, rtol=0.15)


def test_identical_trials_give_point_intervals_and_a_stable_top_k():
    scores = np.tile(np.linspace(0, 1, 20).reshape(1, 4, 5), (30, 1, 1))
    low, high = head_intervals(scores, BootstrapSettings())
    np.testing.assert_allclose(low, scores[0])
    np.testing.assert_allclose(high, scores[0])
    assert top_k_jaccard(scores, 5, BootstrapSettings()) == 1.0


def test_top_k_jaccard_falls_when_heads_swap_between_trials():
    rng = np.random.default_rng(1)
    clear = np.zeros((40, 1, 10))
    clear[:, 0, :3] = 1.0 + rng.normal(0, 0.01, (40, 3))             # heads 0-2 always on top
    noisy = clear.copy()
    noisy[:, 0, 2:5] = rng.uniform(0, 1, (40, 3))                    # heads 2-4 compete for the third place
    assert top_k_jaccard(clear, 3, BootstrapSettings()) == 1.0
    assert top_k_jaccard(noisy, 3, BootstrapSettings()) < 0.9


@pytest.mark.parametrize("needle_count", [3, 14, 16])
def test_spread_order_keeps_every_prefix_balanced(needle_count):
    needles = [f"r{i:02d}" for i in range(needle_count)]
    lengths = [1000, 2798, 4596, 6394, 8192]
    depths = [round(d, 6) for d in FULL_DEPTHS]
    grid = make_grid(needles, lengths, depths, [0])
    order = spread_order(list(reversed(grid)))
    assert order == spread_order(grid) and sorted(order) == grid          # a permutation, whatever the input order
    for axis, values in (("length", lengths), ("depth", depths), ("needle_id", needles)):
        assert {getattr(t, axis) for t in order[:len(values)]} == set(values), axis   # each value once, first
        counts = dict.fromkeys(values, 0)
        for trial in order:
            counts[getattr(trial, axis)] += 1
            assert max(counts.values()) - min(counts.values()) <= 2, axis


def _identity():
    return headprobe.ModelIdentity("m", "test", "llama", 2, 4, 2, 8, ("full_attention",) * 2)


def _records(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"trial": f"t{i}", "needle": "r01", "gates": {"published": True}, "seconds": 1.0,
             "scores": {"enhanced_retrieval": rng.uniform(0, 1, (2, 4)).round(6).tolist()}} for i in range(n)]


def test_needle_profiles_carry_bootstrap_intervals_that_survive_a_round_trip(tmp_path):
    profile = needle_profile("enhanced_retrieval", _identity(), {"pass": "retrieval"}, _records(25))
    iv = profile.intervals
    assert iv["method"] == "bootstrap" and iv["trials"] == 25 and set(iv["top_k_jaccard"]) == {"10", "20"}
    low, high, mean = np.array(iv["low"]), np.array(iv["high"]), np.array(profile.query_heads)
    assert (low <= mean + 1e-9).all() and (mean <= high + 1e-9).all()
    path = profile.save(tmp_path / "p.json")
    again = headprobe.Profile.load(path)
    assert again.intervals == iv and again.fingerprint == profile.fingerprint
    lines = headprobe.summarize_file(path, top=3)
    assert any("90% bootstrap interval" in line for line in lines)
    assert any(line.strip().startswith("1.") and "[" in line for line in lines)


def test_a_malformed_intervals_block_is_named(tmp_path):
    profile = needle_profile("enhanced_retrieval", _identity(), {"pass": "retrieval"}, _records(5))
    obj = profile.to_json()
    obj["intervals"]["low"] = [[0.0, 0.1]]
    path = tmp_path / "bad.json"
    headprobe.frontend.atomic_write_json(path, obj)
    with pytest.raises(FileFormatError, match="intervals.low"):
        headprobe.Profile.load(path)
    obj = needle_profile("enhanced_retrieval", _identity(), {"pass": "retrieval"}, _records(5)).to_json()
    obj["intervals"]["level"] = 90
    headprobe.frontend.atomic_write_json(path, obj)
    with pytest.raises(FileFormatError, match="intervals.level"):
        headprobe.Profile.load(path)
