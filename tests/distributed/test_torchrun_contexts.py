"""``torchrun --nproc-per-node 2 -m headprobe profile --contexts FILE``: the ranks share the user's examples and
rank 0 writes the profile one process writes (tiny Llama, gloo, one thread per rank)."""

from __future__ import annotations

import json

import pytest
from headprobe_cli.main import main

from tests.distributed.test_torchrun_smollm2 import log_trials, torchrun, untimed

pytestmark = pytest.mark.slow

ROWS = [{"id": f"x{i}", "context": "The river ran past the old mill. " * (i + 1) + "The secret code is blue tulip seven.",
         "question": "Which code?", "answer": "blue tulip seven"} for i in range(5)]


def test_two_ranks_write_the_profile_of_one_process(tiny_dir, tmp_path):
    import torch

    data = tmp_path / "own.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    args = ["profile", "--model", str(tiny_dir), "--device", "cpu", "--no-chat-template", "--contexts", str(data),
            "--probe", "query_focus"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main([*args, "--out-dir", str(tmp_path / "one")]) == 0
    finally:
        torch.set_num_threads(threads)
    proc = torchrun([*args, "--out-dir", str(tmp_path / "ranks")], fresh=[tmp_path / "ranks"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    one = json.loads((tmp_path / "one" / "tiny.query_focus.json").read_text())
    ranks = json.loads((tmp_path / "ranks" / "tiny.query_focus.json").read_text())
    assert ranks["fingerprint"] == one["fingerprint"]
    assert untimed(ranks["trials"]) == untimed(one["trials"]) and ranks["trials"]["total"] == 5
    assert untimed(ranks["probe"])["contexts"] == untimed(one["probe"])["contexts"]
    shards = [log_trials(tmp_path / "ranks" / f"tiny.query_focus.shard{r}of2.trials.jsonl") for r in (0, 1)]
    assert shards == [["x0", "x2", "x4"], ["x1", "x3"]]
