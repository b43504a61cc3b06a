"""Bootstrap intervals and top-k Jaccard indices depend on the set of trials only: one process, the ranks
of a torchrun launch, another batch order and merged shard logs give the same numbers, as they give the
same scores."""

from __future__ import annotations

import numpy as np
import pytest

from headprobe.probes.aggregate import merge_logs, profiles_from_log
from headprobe.probes.bootstrap import BootstrapSettings, canonical_order, head_intervals, top_k_jaccard
from headprobe.probes.trial_grid import shard_trials


def test_resampling_does_not_depend_on_the_order_of_the_trials():
    scores = np.random.default_rng(7).gamma(0.3, 0.05, size=(60, 6, 9))      # sparse, like head scores
    settings = BootstrapSettings()
    low, high = head_intervals(scores, settings)
    jaccard = top_k_jaccard(scores, 10, settings)
    for seed in range(5):
        order = np.random.default_rng(seed).permutation(len(scores))
        l2, h2 = head_intervals(scores[order], settings)
        assert np.array_equal(low, l2) and np.array_equal(high, h2)
        assert top_k_jaccard(scores[order], 10, settings) == jaccard


def test_the_canonical_order_sorts_by_the_scores_alone():
    scores = np.array([[[2.0, 0.0]], [[1.0, 5.0]], [[1.0, 3.0]], [[1.0, 3.0]]])
    assert canonical_order(scores).tolist() == [2, 3, 1, 0]
    assert canonical_order(scores[::-1]).tolist() == [0, 1, 2, 3]


@pytest.fixture(scope="module")
def tiny_identity():
    import conftest

    return conftest.make_tiny_llama().identity


def _record(spec, rng):
    return {"trial": spec.id, "needle": spec.needle_id, "length": spec.length, "depth": spec.depth,
            "seed": spec.seed, "gates": {"published": True, "rouge1_recall": 1.0}, "passed": True,
            "scores": {"retrieval": rng.gamma(0.3, 0.05, size=(4, 4)).round(6).tolist(),
                       "enhanced_retrieval": rng.gamma(0.3, 0.05, size=(4, 4)).round(6).tolist()},
            "seconds": 0.1}


def test_a_merged_grid_has_the_intervals_of_one_process(tiny_identity, tmp_path):
    from test_output_files import grid, needle_settings

    from headprobe.files.trial_log import TrialLog

    settings = needle_settings(tiny_identity, depths=[i / 10 for i in range(11)])
    rng = np.random.default_rng(3)
    by_id = {spec.id: _record(spec, rng) for spec in grid(settings)}
    one = [by_id[s.id] for s in grid(settings)]                          # one process, grid order
    single = {p.kind: p for p in profiles_from_log(settings, one)}
    paths = []
    for i in range(2):                                                   # two ranks, each in its own order
        path = tmp_path / f"tiny.retrieval.shard{i}of2.trials.jsonl"
        with TrialLog(path, needle_settings(tiny_identity, (i, 2), depths=settings["depths"])) as log:
            for spec in reversed(shard_trials(grid(settings), (i, 2))):
                log.append(by_id[spec.id])
        paths.append(path)
    merged_logs = merge_logs(paths)
    merged = {p.kind: p for p in profiles_from_log(merged_logs.settings, merged_logs.records)}
    for kind in ("retrieval", "enhanced_retrieval"):
        assert merged[kind].query_heads == single[kind].query_heads
        assert merged[kind].intervals["low"] == single[kind].intervals["low"]
        assert merged[kind].intervals["high"] == single[kind].intervals["high"]
        assert merged[kind].intervals["top_k_jaccard"] == single[kind].intervals["top_k_jaccard"]
