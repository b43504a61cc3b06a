"""Ranks from torchrun's environment, each rank's share and files, merging shard logs, and a real gloo group."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from torchrun_launch import run_torchrun

import headprobe
from headprobe.distributed.profile_ranks import merge_pass
from headprobe.distributed.ranks import Ranks, ranks_from_env
from headprobe.errors import HeadprobeError, flag_spelling

ROOT = Path(__file__).resolve().parents[2]


def test_no_torchrun_is_one_process():
    ranks = ranks_from_env({})
    assert ranks == Ranks(0, 1, 0) and not ranks.distributed and ranks.is_main and ranks.shard is None
    assert ranks.part_path("out/eval.json") == Path("out/eval.json")
    assert ranks.mine(list("abc")) == list("abc")
    with headprobe.process_group(env={}) as same:       # nothing to join
        assert same == ranks


def test_torchrun_environment():
    ranks = ranks_from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (ranks.rank, ranks.world_size, ranks.local_rank, ranks.shard) == (3, 4, 1, (3, 4))
    assert not ranks.is_main
    assert ranks.mine(list(range(10))) == [3, 7]
    assert [i for i in range(10) if ranks.owns(i)] == [3, 7]
    assert ranks.part_path("out/eval.json") == Path("out/eval.shard3of4.json")
    assert ranks.part_path("abl.runs.jsonl") == Path("abl.runs.shard3of4.jsonl")


@pytest.mark.parametrize("env, expected", [
    ({"RANK": "2", "WORLD_SIZE": "2"}, "environment: RANK=2, LOCAL_RANK=2, WORLD_SIZE=2; expected 0 <= RANK < WORLD_SIZE"),
    ({"RANK": "one", "WORLD_SIZE": "2"}, "environment variable RANK='one': expected an integer"),
])
def test_bad_environment_is_one_line(env, expected):
    with pytest.raises(HeadprobeError) as err:
        ranks_from_env(env)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_a_hand_given_shard_is_refused_under_torchrun():
    Ranks(0, 1).check_shard((0, 2))                     # one process: --shard is how to split by hand
    with pytest.raises(HeadprobeError, match=r"shard='0/2': the 2 torchrun ranks already split the grid"):
        Ranks(0, 2).check_shard((0, 2))
    with flag_spelling({}), pytest.raises(HeadprobeError, match=r"^--shard 0/2: the 2 torchrun"):
        Ranks(1, 2).check_shard((0, 2))


def test_cpu_ranks_keep_the_device_asked_for():
    import torch

    if torch.cuda.is_available():
        pytest.skip("GPU machine: each rank takes cuda:LOCAL_RANK there")
    ranks = Ranks(1, 2, 1)
    assert ranks.device("cpu") == "cpu"
    assert ranks.device(None) is None                   # load_model picks the CPU
    assert ranks.device("auto") == "auto"               # offload on the CPU is every rank's own


def _part(settings: dict, trials: list[str], shard: list[int]) -> dict:
    return {"settings": {**settings, "shard": shard}, "trials": [{"trial": t, "x": t.upper()} for t in trials]}


def test_merge_pass_unites_the_ranks_trials_as_one_log():
    settings = {"pass": "retrieval", "lengths": [300], "batch_size": 4}
    parts = [_part(settings, ["b", "a"], [0, 2]), _part({**settings, "batch_size": 1}, ["c", "a"], [1, 2])]
    merged, trials = merge_pass(parts, ["r0.jsonl", "r1.jsonl"])
    assert merged == {**settings, "shard": None}        # what one process's log says
    assert [t["trial"] for t in trials] == ["a", "b", "c"]
    other = _part({**settings, "lengths": [400]}, ["d"], [1, 2])
    with pytest.raises(HeadprobeError, match=r"^r1.jsonl: made with other settings than r0.jsonl \(lengths\)$"):
        merge_pass([parts[0], other], ["r0.jsonl", "r1.jsonl"])


def test_merge_pass_refuses_ranks_of_other_versions_and_skips_ranks_without_a_log():
    settings = {"pass": "retrieval", "lengths": [300], "headprobe_version": "1.0"}
    parts = [{**_part(settings, ["a"], [0, 3]), "log": "r0.jsonl"},
             {**_part({**settings, "headprobe_version": "1.1"}, ["b"], [1, 3]), "log": "r1.jsonl"}]
    with pytest.raises(HeadprobeError, match=r"^r1.jsonl: written by headprobe 1.1, r0.jsonl by headprobe 1.0; "):
        merge_pass(parts)
    # a rank dealt nothing (no log) takes no part, whatever its settings say
    idle = {**_part({**settings, "headprobe_version": "1.1"}, [], [2, 3]), "log": None}
    merged, trials = merge_pass([parts[0], idle])
    assert merged["headprobe_version"] == "1.0" and [t["trial"] for t in trials] == ["a"]
    with pytest.raises(HeadprobeError, match=r"^r0b.jsonl: shard 0/3 again \(r0.jsonl is shard 0/3 too\)"):
        merge_pass([parts[0], {**parts[0], "log": "r0b.jsonl"}])


def test_one_process_gathers_its_own_object():
    assert Ranks().gather_json({"a": [1, 2.5, None]}) == [{"a": [1, 2.5, None]}]


def test_two_gloo_ranks_gather_at_rank_zero(tmp_path):
    """A real torchrun launch: two processes join a gloo group, rank 0 alone gets both objects."""
    script = tmp_path / "gather.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys, time
        import headprobe
        with headprobe.process_group() as ranks:
            got = ranks.gather_json({{"rank": ranks.rank, "mine": ranks.mine(list(range(5)))}})
            with ranks.local_main_first():
                order = open({str(tmp_path / "order")!r}, "a")
                order.write(str(ranks.rank) + "\\n")
                order.close()
            with open({str(tmp_path)!r} + f"/rank{{ranks.rank}}.json", "w") as out:
                json.dump({{"backend": ranks.backend, "got": got}}, out)
            if ranks.is_main:               # rank 0 still writing its outputs after the last collective
                time.sleep(1.0)
                open({str(tmp_path / "order")!r}, "a").write("written\\n")
        open({str(tmp_path / "order")!r}, "a").write(f"left{{ranks.rank}}\\n")
    """))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")])}
    proc = run_torchrun([str(script)], env, fresh=[tmp_path / name for name in ("order", "rank0.json", "rank1.json")],
                        timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    zero = json.loads((tmp_path / "rank0.json").read_text())
    one = json.loads((tmp_path / "rank1.json").read_text())
    assert zero == {"backend": "gloo", "got": [{"rank": 0, "mine": [0, 2, 4]}, {"rank": 1, "mine": [1, 3]}]}
    assert one == {"backend": "gloo", "got": None}
    order = (tmp_path / "order").read_text().split()
    assert order[:2] == ["0", "1"]                                   # local rank 0 went first
    # no rank leaves the group (and tears it down) before rank 0 has written what it writes
    assert order[2] == "written" and sorted(order[3:]) == ["left0", "left1"]
