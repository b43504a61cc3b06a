"""Calibration and held-out items, and memory targets as tokens per KV head (the runtime's bytes)."""

import pytest
from conftest import SMOLLM2_IDENTITY

from headprobe import HeadprobeError
from headprobe.explain.engines.headprobe_runtime import runtime_allocation
from headprobe.explain.setting import Setting
from headprobe.models.identity import ModelIdentity
from headprobe.sizes import parse_bytes, parse_share
from headprobe.tune.memory import MemoryTarget, capacity_for
from headprobe.tune.split import hash_order, split_items

IDS = [f"r{i:02d}" for i in range(1, 15)]


def test_a_share_is_held_out_by_hash_whatever_the_order_of_the_ids():
    split = split_items(IDS, holdout_share=0.3, seed=0)
    assert len(split.holdout) == 4 and len(split.calibration) == 10
    assert set(split.holdout) | set(split.calibration) == set(IDS) and not set(split.holdout) & set(split.calibration)
    again = split_items(list(reversed(IDS)), holdout_share=0.3, seed=0)
    assert set(again.holdout) == set(split.holdout) and again.calibration == split.calibration
    assert list(split.calibration) == [i for i in hash_order(IDS, 0) if i not in split.holdout]
    assert split.rule == {"holdout_share": 0.3, "seed": 0}
    assert set(split_items(IDS, holdout_share=0.3, seed=1).holdout) != set(split.holdout)
    # adding an item moves no other across the split
    more = split_items([*IDS, "r15"], holdout_share=0.3, seed=0)
    assert set(split.holdout) - {"r15"} <= set(more.holdout) | set(more.calibration)


def test_held_out_ids_are_never_searched():
    split = split_items(IDS[:5], holdout_ids=["r05", "r04"])
    assert split.holdout == ("r04", "r05") and set(split.calibration) == {"r01", "r02", "r03"}
    assert split.to_json()["holdout_ids"] == ["r05", "r04"]


@pytest.mark.parametrize("kwargs, message", [
    ({"ids": ["r01"]}, "tune needs at least two items (one to search on, one held out); the task has 1"),
    ({"ids": IDS[:3], "holdout_ids": ["r09"]}, "holdout_ids='r09': not an item of the task"),
    ({"ids": IDS[:2], "holdout_ids": ["r01", "r02"]}, "holdout_ids: holds every item; leave some to search on"),
    ({"ids": IDS, "holdout_share": 1.0}, "holdout_share=1.0: expected a share between 0 and 1"),
])
def test_bad_splits_are_refused(kwargs, message):
    with pytest.raises(HeadprobeError) as err:
        split_items(**kwargs)
    assert message in str(err.value)


def test_sizes_and_shares_parse():
    assert parse_bytes("2GiB") == 2 * 2**30 and parse_bytes("500MB") == 500 * 10**6
    assert parse_bytes("1.5 MiB") == 3 * 2**19 and parse_bytes("123456") == 123456
    assert parse_share("5%") == pytest.approx(0.05) and parse_share("0.05") == pytest.approx(0.05)
    for bad in ("2 parsecs", "-1GiB", "0"):
        with pytest.raises(HeadprobeError, match="expected a size such as 2GiB"):
            parse_bytes(bad)
    for bad in ("150%", "0", "lots"):
        with pytest.raises(HeadprobeError, match="expected a share of the full cache such as 5%"):
            parse_share(bad)


def _bytes(capacity: int, context: int, identity: ModelIdentity = SMOLLM2_IDENTITY, dtype: str = "float32") -> int:
    """What explain says the runtime allocates for a uniform cache (the same arithmetic, called independently)."""
    from headprobe.allocation.api import allocate

    bm = allocate("uniform", [], identity, capacity=capacity, window=0)
    return runtime_allocation(bm, identity, Setting(context, 1, dtype, 24), "snapkv", {"window": 1}).bytes_prefill


def test_a_byte_target_gives_the_largest_capacity_that_fits():
    cap, record = capacity_for(MemoryTarget(4000, bytes=4 * 2**20, dtype="float32"), SMOLLM2_IDENTITY)
    assert _bytes(cap, 4000) <= 4 * 2**20 < _bytes(cap + 1, 4000)
    # by hand: 30 layers x 3 KV heads, (cap + 23 decode rows: the 24th new token is never fed back) x
    # (2 x 64 x 4 + 4 position) bytes, 1 spare row and 3 x 8 metadata bytes per segment, per layer
    per_layer = (3 * (cap + 23) + 1) * (2 * 64 * 4 + 4) + 3 * 24
    assert record["capacity_bytes"] == 30 * per_layer == _bytes(cap, 4000)
    assert record["capacity"] == cap == 66


def test_a_share_target_is_a_share_of_the_full_cache_at_the_context():
    cap, record = capacity_for(MemoryTarget(4000, share=0.05, dtype="bfloat16"), SMOLLM2_IDENTITY)
    full = 30 * 3 * 4000 * 2 * 64 * 2
    assert record["full_cache_bytes"] == full
    assert _bytes(cap, 4000, dtype="bfloat16") <= 0.05 * full < _bytes(cap + 1, 4000, dtype="bfloat16")
    assert record["capacity_share"] == pytest.approx(_bytes(cap, 4000, dtype="bfloat16") / full)


@pytest.mark.parametrize("target, message", [
    (MemoryTarget(4000, bytes=1000), "cache_bytes=1000: one token per KV head already allocates"),
    (MemoryTarget(1000, bytes=2**34), "a full cache of 1000 tokens fits; nothing to tune"),
])
def test_targets_out_of_reach_are_refused(target, message):
    with pytest.raises(HeadprobeError, match=message):
        capacity_for(target, SMOLLM2_IDENTITY)


def test_a_target_needs_exactly_one_of_share_and_bytes():
    with pytest.raises(HeadprobeError, match="give cache_share or cache_bytes, one of them"):
        MemoryTarget(4000)
