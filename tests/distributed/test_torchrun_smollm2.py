"""``torchrun --nproc-per-node 2 -m headprobe ...`` on SmolLM2 (gloo, one thread per rank) writes what one
process writes: the same profile scores and trial counts, the same eval cells, the same ablation; a rank
killed mid-run is rerun with ``--resume`` and redoes no finished trial."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from headprobe_cli.main import main
from torchrun_launch import run_torchrun, torchrun_command

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg",
       "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")])}

#: 3 needles x 1 length x 2 depths (two prefix groups, one per rank), one trial per forward so every trial
#: is logged on its own; two layer-retention prompts (one per rank).
PROFILE = ["profile", "--device", "cpu", "--probe", "retrieval", "enhanced_retrieval", "layer_retention",
           "--lengths", "300", "--depths", "0", "100", "--needles", "r01", "r02", "r04", "--batch-size", "1",
           "--tasks", "single_doc_qa", "--samples-per-task", "2", "--retention-max-tokens", "512"]
KINDS = ("retrieval", "enhanced_retrieval", "layer_retention")
#: What is measured where a trial ran, not computed from the model.
TIMES = {"seconds", "mean_seconds", "ms_per_token", "created"}


def torchrun(args: list[str], fresh: Sequence[Path] = ()) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node 2 -m headprobe ARGS`` (torchrun is torch.distributed.run) to
    its end; ``fresh``: what it writes, cleared if gloo's transport breaks and the launch starts again."""
    return run_torchrun(["-m", "headprobe", *args], ENV, fresh=fresh)


def torchrun_in_background(args: list[str]) -> subprocess.Popen:
    """The launch of :func:`torchrun`, running while the caller watches it."""
    return subprocess.Popen(torchrun_command(["-m", "headprobe", *args]), env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def untimed(obj):
    """``obj`` without the wall-clock fields (they differ between any two runs)."""
    if isinstance(obj, dict):
        return {k: untimed(v) for k, v in obj.items() if k not in TIMES}
    if isinstance(obj, list):
        return [untimed(v) for v in obj]
    return obj


def log_trials(path: Path) -> list[str]:
    return [json.loads(line)["trial"] for line in path.read_text().splitlines()[1:] if line.strip()]


def profiles(out: Path) -> dict[str, dict]:
    return {kind: json.loads((out / f"smollm2-135m.{kind}.json").read_text()) for kind in KINDS}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The profile of one process (``python -m headprobe profile``), the reference of the ranks' runs."""
    import torch

    out = tmp_path_factory.mktemp("one")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main([*PROFILE, "--out-dir", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    return profiles(out)


def assert_same_profiles(out: Path, reference: dict[str, dict]) -> None:
    merged = profiles(out)
    for kind in KINDS:
        assert merged[kind]["fingerprint"] == reference[kind]["fingerprint"], kind
        assert untimed(merged[kind]["trials"]) == untimed(reference[kind]["trials"]), kind
        assert untimed(merged[kind]["probe"]) == untimed(reference[kind]["probe"]), kind   # shard: null
    assert reference["retrieval"]["trials"]["total"] == 6 and reference["retrieval"]["trials"]["passed"] > 0
    assert reference["layer_retention"]["trials"]["total"] == 2


def test_two_ranks_write_the_profile_of_one_process(one_process, tmp_path):
    out = tmp_path / "ranks"
    proc = torchrun([*PROFILE, "--out-dir", str(out)], fresh=[out])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert_same_profiles(out, one_process)
    # each rank ran its own prefix group and retention prompt, in its own log
    for rank, depth in ((0, "0.0000"), (1, "1.0000")):
        trials = log_trials(out / f"smollm2-135m.retrieval.shard{rank}of2.trials.jsonl")
        assert len(trials) == 3 and all(f"depth={depth}" in t for t in trials)
        assert len(log_trials(out / f"smollm2-135m.layer_retention.shard{rank}of2.trials.jsonl")) == 1
    assert "rank 1/2: 4 trials run, 0 resumed" in proc.stderr
    assert "8 trials run, 0 resumed from logs" in proc.stderr


def _descendants(pid: int) -> list[int]:
    found = []
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:          # the process has ended
        return found
    for child in children:
        found += [int(child), *_descendants(int(child))]
    return found


def _rank_process(launcher: int, rank: int) -> int | None:
    for pid in _descendants(launcher):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"-m" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    return None


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the rank's process through /proc")
def test_a_killed_rank_resumes_without_redoing_finished_trials(one_process, tmp_path):
    out = tmp_path / "ranks"
    launch = torchrun_in_background([*PROFILE, "--out-dir", str(out)])
    log1 = out / "smollm2-135m.retrieval.shard1of2.trials.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and launch.poll() is None and not (log1.exists() and log_trials(log1)):
        time.sleep(0.05)
    assert launch.poll() is None, launch.communicate()
    victim = _rank_process(launch.pid, 1)
    assert victim is not None and launch.poll() is None, launch.communicate()
    os.kill(victim, signal.SIGKILL)                              # rank 1 dies after its first trial
    _, err = launch.communicate(timeout=300)
    assert launch.returncode != 0                                # torchrun stops the launch
    before = {rank: log_trials(out / f"smollm2-135m.retrieval.shard{rank}of2.trials.jsonl") for rank in (0, 1)}
    assert 1 <= len(before[1]) < 3, err[-3000:]

    proc = torchrun([*PROFILE, "--out-dir", str(out), "--resume"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    for rank in (0, 1):
        after = log_trials(out / f"smollm2-135m.retrieval.shard{rank}of2.trials.jsonl")
        assert len(after) == 3 == len(set(after))                # nothing run twice
        assert after[:len(before[rank])] == before[rank]         # the finished trials kept, not redone
    resumed = len(before[0]) + len(before[1])
    line = next(line for line in proc.stderr.splitlines() if "resumed from logs" in line)
    run, skipped = int(line.split()[0]), int(line.split(", ")[1].split()[0])
    assert skipped >= resumed and run + skipped == 8, line
    assert_same_profiles(out, one_process)


EVAL = ["eval", "--device", "cpu", "--settings", "full", "snapkv", "--capacities", "64", "--lengths", "300",
        "--depths", "0", "100", "--needle-ids", "r01", "r02", "--max-new-tokens", "16", "--plot", "none"]


def test_two_ranks_write_the_eval_of_one_process(tmp_path, one_thread):
    assert main([*EVAL, "--out", str(tmp_path / "one" / "eval.json")]) == 0
    proc = torchrun([*EVAL, "--out", str(tmp_path / "ranks" / "eval.json")], fresh=[tmp_path / "ranks"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    one = json.loads((tmp_path / "one" / "eval.json").read_text())
    merged = json.loads((tmp_path / "ranks" / "eval.json").read_text())
    assert [c["trial"] for c in merged["cells"]] == [c["trial"] for c in one["cells"]]
    assert len(one["cells"]) == 4 and merged["complete"] and "shard" not in merged
    for mine, ref in zip(merged["cells"], one["cells"]):            # answers, scores and bytes, cell by cell
        assert untimed(mine) == untimed(ref), ref["trial"]
    assert untimed(merged["summary"]) == untimed(one["summary"])
    assert untimed({k: v for k, v in merged.items() if k not in ("cells", "summary")}) == \
        untimed({k: v for k, v in one.items() if k not in ("cells", "summary")})
    assert max(c["accuracy"] for c in one["cells"]) > 0                # the needle is found somewhere
    for rank in (0, 1):                                             # each rank's own part, one depth each
        part = json.loads((tmp_path / "ranks" / f"eval.shard{rank}of2.json").read_text())
        assert part["shard"] == [rank, 2] and {c["depth"] for c in part["cells"]} == {[0.0, 1.0][rank]}


def test_two_ranks_write_the_dataset_eval_of_one_process(tmp_path, one_thread):
    rows = [{"id": f"q{i}", "context": f"The locker code for team {name} is {code}. " * 3 + "The hall is quiet. " * 10,
             "input": f"What is the locker code for team {name}?", "answers": [code]}
            for i, (name, code) in enumerate([("red", "4471"), ("green", "9032"), ("blue", "1288")])]
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["eval", "--device", "cpu", "--task", "dataset", "--dataset", str(data), "--settings", "full", "snapkv",
            "--capacities", "32", "--max-new-tokens", "8", "--plot", "none"]
    assert main([*args, "--out", str(tmp_path / "one" / "qa.json")]) == 0
    proc = torchrun([*args, "--out", str(tmp_path / "ranks" / "qa.json")], fresh=[tmp_path / "ranks"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    one = json.loads((tmp_path / "one" / "qa.json").read_text())
    merged = json.loads((tmp_path / "ranks" / "qa.json").read_text())
    assert untimed(merged["cells"]) == untimed(one["cells"]) and merged["task"] == one["task"]
    assert [t["item"] for t in merged["cells"][0]["trials"]] == ["q0", "q1", "q2"]
    assert json.loads((tmp_path / "ranks" / "qa.shard1of2.json").read_text())["task"]["examples"] == 1


def test_two_ranks_write_the_ablation_of_one_process(tmp_path, one_thread):
    args = ["ablate", "--device", "cpu", "--profile", str(ROOT / "profiles" / "smollm2-135m.retrieval.json"),
            "--k", "3", "--lengths", "300", "--depths", "50", "--needle-ids", "r01", "r02", "--max-new-tokens", "16",
            "--plot", "none"]
    assert main([*args, "--out", str(tmp_path / "one" / "ablation.json")]) == 0
    proc = torchrun([*args, "--out", str(tmp_path / "ranks" / "ablation.json")], fresh=[tmp_path / "ranks"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    one = json.loads((tmp_path / "one" / "ablation.json").read_text())
    merged = json.loads((tmp_path / "ranks" / "ablation.json").read_text())
    assert untimed(merged) == untimed(one)
    runs = {rank: log_trials(tmp_path / "ranks" / f"ablation.runs.shard{rank}of2.jsonl") for rank in (0, 1)}
    assert runs == {0: ["baseline", "random-3"], 1: ["top-3"]}
