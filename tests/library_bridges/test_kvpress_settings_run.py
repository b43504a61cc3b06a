"""kvpress settings run by kvpress's own pipeline in headprobe's eval, on SmolLM2 and RULER-shaped prompts:
the same prompts as headprobe's settings, the bytes kvpress really holds, the tokens it attends.

Runs where kvpress is installed (its own environment, ``.ci/kvpress``)."""

from __future__ import annotations

import pytest
from ruler_rows import niah_row, write_task

kvpress = pytest.importorskip("kvpress")

from headprobe.eval.datasets import run_dataset_eval
from headprobe.eval.ruler_data import load_ruler_dir
from headprobe.eval.ruler_task import RulerTask
from headprobe.eval.settings import expand_settings
from headprobe.library_bridges.press_settings import context_ratio, make_press

pytestmark = pytest.mark.slow

CAPACITY = 160


@pytest.fixture(scope="module")
def result(smollm2, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ruler")
    write_task(folder, "niah_single_1", [niah_row(i, key, value, repeats=24) for i, (key, value) in enumerate(
        [("quiet-harbour", "4817293"), ("amber-lantern", "6051142"), ("north-meadow", "2390517")])])
    examples = load_ruler_dir(folder)
    settings = expand_settings(["full", "kvpress:none", "kvpress:snapkv", "kvpress:adakv",
                                "kvpress:snapkv[compress_questions=true]", "kvpress:block_keydiff[block_size=32]"],
                               [CAPACITY])
    for s in settings:
        s.check_policy()
    out = run_dataset_eval(smollm2, examples, settings, folder / "out.json", max_length=8192, max_new_tokens=12,
                           answer_task=RulerTask({}, max_new_tokens=12))
    out.examples = {ex.id: ex for ex in examples}
    return out


def _trials(result, label):
    return next(c for c in result.cells if c["setting"] == label)["trials"]


def test_kvpress_without_a_press_answers_as_headprobes_full_cache(result):
    full, none = _trials(result, "full"), _trials(result, "kvpress:none")
    assert [t["response"] for t in none] == [t["response"] for t in full]
    assert all(t["score"] == 1.0 for t in full)         # the model finds these needles: the agreement means something
    for t in none:      # no press: kvpress's cache held every token, as a full cache would
        assert t["cache_bytes"] == t["full_cache_bytes"]
        assert t["attended_tokens"] == t["prompt_len"] and t["compression_ratio"] is None


def test_a_scorer_press_holds_the_capacity_and_a_head_wise_press_masks_a_full_cache(result):
    for label in (f"kvpress:snapkv@{CAPACITY}", f"kvpress:snapkv[compress_questions=true]@{CAPACITY}",
                  f"kvpress:block_keydiff[block_size=32]@{CAPACITY}"):
        for t in _trials(result, label):
            assert t["attended_tokens"] == CAPACITY
            # the cache held the capacity and the answer's tokens (g generated, the last never cached; g is
            # new_tokens, or one more when the answer ended with SmolLM2's EOS, which is not counted)
            assert any(t["cache_bytes"] * (t["prompt_len"] + g - 1) == t["full_cache_bytes"] * (CAPACITY + g - 1)
                       for g in (t["new_tokens"], t["new_tokens"] + 1))
    for t in _trials(result, f"kvpress:adakv@{CAPACITY}"):
        assert t["attended_tokens"] == CAPACITY            # AdaKV masks keys: the tokens attended shrink...
        assert t["cache_bytes"] == t["full_cache_bytes"]   # ...the bytes do not


def test_block_keydiff_is_kvpress_block_press_over_its_keydiff_press():
    """``kvpress:block_keydiff`` is KeyDiff as its paper prefills, in kvpress's words: ``BlockPress`` over
    ``KeyDiffPress``, the ratio on the inner press, ``block_size`` on the block press."""
    press = make_press("block_keydiff", {"block_size": 64}, 0.75)
    assert isinstance(press, kvpress.BlockPress) and isinstance(press.press, kvpress.KeyDiffPress)
    assert (press.block_size, press.compression_ratio, press.press.compression_ratio) == (64, 0.75, 0.75)
    assert make_press("block_keydiff", {}, 0.5).block_size == 128               # kvpress's default, the paper's B


def test_each_prompt_runs_at_the_ratio_that_keeps_the_capacity(smollm2, result):
    from kvpress.utils import compute_n_kept

    task = RulerTask({}, max_new_tokens=12)
    for t in _trials(result, f"kvpress:snapkv@{CAPACITY}"):
        ex = result.examples[t["item"]]
        ids = task.prompt_ids(smollm2.tokenizer, ex, 8192, True)
        start, _ = task.question_span(smollm2.tokenizer, ex, ids, True)
        question = len(ids) - start
        assert t["compression_ratio"] == round(context_ratio(CAPACITY, start, question), 6)
        assert compute_n_kept(start, context_ratio(CAPACITY, start, question)) == CAPACITY - question


def test_an_interrupted_run_with_kvpress_settings_resumes_without_redoing_a_finished_trial(smollm2, tmp_path,
                                                                                           monkeypatch, result):
    # the run is stopped at its fifth kvpress prompt (kvpress:none's three and kvpress:snapkv's first answered);
    # the resumed run makes only the two trials left and ends with the answers of the uninterrupted run above
    from headprobe.eval import setting_run

    folder = tmp_path / "ruler"
    write_task(folder, "niah_single_1", [niah_row(i, key, value, repeats=24) for i, (key, value) in enumerate(
        [("quiet-harbour", "4817293"), ("amber-lantern", "6051142"), ("north-meadow", "2390517")])])
    examples = load_ruler_dir(folder)
    labels = ["full", "kvpress:none", "kvpress:snapkv"]
    calls = []
    real = setting_run.run_press

    def stop_at_the_fifth(*args, **kwargs):
        calls.append(args[3])
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(setting_run, "run_press", stop_at_the_fifth)

    def run(resume):
        settings = expand_settings(labels, [CAPACITY])
        return run_dataset_eval(smollm2, examples, settings, tmp_path / "out.json", max_length=8192,
                                max_new_tokens=12, answer_task=RulerTask({}, max_new_tokens=12), resume=resume)

    with pytest.raises(KeyboardInterrupt):
        run(False)
    assert len(calls) == 5
    resumed = run(True)
    assert calls[5:] == ["snapkv", "snapkv"]        # six kvpress trials in all, four finished before the stop
    for label in ("kvpress:none", f"kvpress:snapkv@{CAPACITY}", "full"):
        again = [t["response"] for t in next(c for c in resumed.cells if c["setting"] == label)["trials"]]
        assert again == [t["response"] for t in _trials(result, label)], label
