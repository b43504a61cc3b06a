"""On the CPU grid layer retention takes two prompts a task unless told; elsewhere every shipped prompt."""

from __future__ import annotations

import contextlib
import json

import headprobe
from headprobe.haystack.tasks import load_tasks
from headprobe.probes.retention_pass import CPU_SAMPLES_PER_TASK


def _run(lm, out, **kwargs):
    with contextlib.suppress(headprobe.HeadprobeError):
        headprobe.run_profile(lm, headprobe.ProfileRequest(probes=["layer_retention"], out_dir=out,
                                                           retention=headprobe.RetentionConfig(max_tokens=256),
                                                           **kwargs))
    lines = (out / "tiny-llama.layer_retention.trials.jsonl").read_text().splitlines()
    return json.loads(lines[0])["settings"], [json.loads(x) for x in lines[1:]]


def test_the_cpu_grid_takes_two_prompts_a_task(tiny_llama, tmp_path):
    tasks = load_tasks(None)
    settings, records = _run(tiny_llama, tmp_path / "cpu")
    assert settings["samples_per_task"] == CPU_SAMPLES_PER_TASK == 2
    assert settings["samples"] == len(records) == sum(min(2, len(v)) for v in tasks.values())
    for task, samples in tasks.items():                       # the first two of each task, as --samples-per-task 2
        assert [r["trial"] for r in records if r["task"] == task] == [s.id for s in samples[:2]]


def test_the_full_grid_and_a_given_count_take_what_they_say(tiny_llama, tmp_path):
    tasks = load_tasks(None)
    settings, records = _run(tiny_llama, tmp_path / "full", grid="full")
    assert "samples_per_task" not in settings and len(records) == sum(len(v) for v in tasks.values())
    settings, records = _run(tiny_llama, tmp_path / "one", samples_per_task=1)
    assert "samples_per_task" not in settings and len(records) == len(tasks)
