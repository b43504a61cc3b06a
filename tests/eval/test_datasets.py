"""The dataset task runs and measures its cells the grid's way: new tokens and ms per token mean the same."""

import json

import pytest
import torch
from conftest import QA_ROWS

import headprobe
from headprobe.eval.datasets import load_qa_dataset, qa_prompt_ids, run_dataset_eval
from headprobe.eval.items import items_from_needles
from headprobe.eval.runner import EvalRequest, run_eval
from headprobe.eval.settings import expand_settings
from headprobe.haystack.context import build_context

torch.set_num_threads(1)

ROWS = QA_ROWS
MAX_NEW = 8


def _greedy(lm, ids):
    """The model's own greedy answer (stock ``generate``, stock cache), stopping at the model's EOS."""
    with torch.no_grad():
        out = lm.model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                                pad_token_id=lm.tokenizer.pad_token_id)
    return out[0, len(ids):].tolist()


def _end_answers_with(lm, token):
    """Make ``token`` the tokenizer's end of sequence and its pad token, as SmolLM2's tokenizer has them."""
    name = lm.tokenizer.convert_ids_to_tokens(token)
    lm.tokenizer.eos_token = name
    lm.tokenizer.pad_token = name
    lm.model.generation_config.eos_token_id = token
    lm.model.generation_config.pad_token_id = token
    assert lm.tokenizer.eos_token_id == lm.tokenizer.pad_token_id == token


def test_dataset_and_needle_cells_count_new_tokens_the_same_way(tiny_llama, tmp_path):
    """Both tasks charge a trial for the tokens up to its end of sequence, padding not counted (here the pad
    token is the EOS, so the EOS is not counted), and divide the cell's time by that."""
    lm = tiny_llama
    import datasets

    examples = load_qa_dataset(datasets.Dataset.from_dict(ROWS))
    ds_prompts = [qa_prompt_ids(lm.tokenizer, ex, 200, chat_template=False) for ex in examples]
    items = items_from_needles(headprobe.load_needles(headprobe.shipped_needle_file("retrieval"))[:2])
    haystack = headprobe.load_haystack()
    needle_prompts = [build_context(lm.tokenizer, haystack, it.needle, 300, 0.5, False, 4096,
                                    question=it.question).input_ids for it in items]
    # the end of sequence: a token the first dataset answer produces a few steps in, not before
    first = _greedy(lm, ds_prompts[0])
    step = next(i for i in range(2, len(first)) if first[i] not in first[:i])
    _end_answers_with(lm, first[step])

    def expected(ids):
        answer = _greedy(lm, ids)
        assert answer.count(lm.tokenizer.eos_token_id) <= 1 and len(answer) <= MAX_NEW
        return max(1, len([t for t in answer if t != lm.tokenizer.eos_token_id]))

    settings = expand_settings(["full"], [])
    ds = run_dataset_eval(lm, examples, settings, tmp_path / "ds.json", max_length=200, max_new_tokens=MAX_NEW,
                          chat_template=False)
    req = EvalRequest(settings, items, [300], [0.5], haystack, {"kind": "needle"}, max_new_tokens=MAX_NEW,
                      chat_template=False)
    grid = run_eval(lm, req, tmp_path / "grid.json")
    ds_trials, needle_trials = ds.cells[0]["trials"], grid.cells[0]["trials"]
    assert [t["new_tokens"] for t in ds_trials] == [expected(ids) for ids in ds_prompts]
    assert [t["new_tokens"] for t in needle_trials] == [expected(ids) for ids in needle_prompts]
    # the first dataset answer ended at its EOS: charged for the `step` tokens before it, not step + 1
    assert ds_trials[0]["new_tokens"] == step
    for cell in (ds.cells[0], grid.cells[0]):
        trials = cell["trials"]
        assert cell["ms_per_token"] == pytest.approx(
            1000 * sum(t["seconds"] for t in trials) / sum(t["new_tokens"] for t in trials))


def test_a_missing_datasets_package_is_one_line(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)      # as on an install without the [eval] extra
    with pytest.raises(headprobe.HeadprobeError, match=r"needs the 'datasets' package.*headprobe\[eval\]"):
        headprobe.load_qa_dataset(str(tmp_path / "qa.jsonl"))


def test_dataset_settings_share_each_prompt_forward_with_the_same_cells(tiny_llama, tmp_path, monkeypatch):
    """One recorded forward per example serves every setting that prefills with plain attention (KeyDiff
    prefills its own way); answers, scores and bytes are those of separate runs."""
    import datasets

    from headprobe.eval import datasets as eval_datasets

    examples = load_qa_dataset(datasets.Dataset.from_dict(ROWS))
    settings = expand_settings(["full", "snapkv[window=8]", "streaming", "keydiff"], [16])
    recorded = []
    real = eval_datasets.record_prefill

    def counting(lm, *args, **kwargs):
        recorded.append(kwargs["input_ids"].shape[-1])
        return real(lm, *args, **kwargs)

    monkeypatch.setattr(eval_datasets, "record_prefill", counting)      # the prefill the dataset eval records
    shared = run_dataset_eval(tiny_llama, examples, settings, tmp_path / "a.json", max_length=200,
                              max_new_tokens=MAX_NEW, chat_template=False)
    assert recorded == [len(qa_prompt_ids(tiny_llama.tokenizer, ex, 200, False)) for ex in examples]
    alone = run_dataset_eval(tiny_llama, examples, settings, tmp_path / "b.json", max_length=200,
                             max_new_tokens=MAX_NEW, chat_template=False, share_prefill=False)
    assert len(recorded) == len(examples)            # the separate runs recorded nothing
    assert [c["trial"] for c in shared.cells] == [c["trial"] for c in alone.cells]
    for a, b in zip(shared.cells, alone.cells, strict=True):
        assert a["accuracy"] == b["accuracy"] and a["cache_bytes"] == b["cache_bytes"]
        for ta, tb in zip(a["trials"], b["trials"], strict=True):
            assert (ta["response"], ta["score"], ta["used_bytes"]) == (tb["response"], tb["score"], tb["used_bytes"])
            assert ta["shared_prefill"] == (a["setting"] != "keydiff@16") and not tb["shared_prefill"]


def test_a_dataset_run_resumes_only_the_settings_not_logged(tiny_llama, tmp_path, monkeypatch):
    """A run stopped after its first setting's cell was logged, and one answer of the second, answers only the
    second setting's other examples when resumed, and its result equals an uninterrupted run's."""
    import datasets

    from headprobe.eval import datasets as dataset_eval

    examples = load_qa_dataset(datasets.Dataset.from_dict(ROWS))
    first = expand_settings(["full", "snapkv[window=8]"], [16])
    answered = []
    real = dataset_eval.run_setting

    def counting(lm, ids, setting, *args, **kwargs):
        answered.append(setting.label)
        return real(lm, ids, setting, *args, **kwargs)

    monkeypatch.setattr(dataset_eval, "run_setting", counting)
    whole = run_dataset_eval(tiny_llama, examples, first, tmp_path / "whole.json", max_length=200,
                             max_new_tokens=MAX_NEW, chat_template=False, share_prefill=False)

    def stop_in_second_setting(_n):
        if len(answered) > len(examples):
            raise KeyboardInterrupt

    out = tmp_path / "r.json"
    answered.clear()
    with pytest.raises(KeyboardInterrupt):
        run_dataset_eval(tiny_llama, examples, first, out, max_length=200, max_new_tokens=MAX_NEW,
                         chat_template=False, share_prefill=False, progress=stop_in_second_setting)
    partial = json.loads(out.read_text())              # what was finished is written, marked unfinished
    assert not partial["complete"] and [c["setting"] for c in partial["cells"]] == [first[0].label]
    answered.clear()
    ticks = []
    resumed = run_dataset_eval(tiny_llama, examples, first, out, max_length=200, max_new_tokens=MAX_NEW,
                               chat_template=False, resume=True, share_prefill=False, progress=ticks.append)
    # neither the logged setting nor the second setting's first answer (in the example log) is answered again
    assert answered == [first[1].label] * (len(examples) - 1)
    assert not dataset_eval.example_log_path(out).exists()          # its answers are in the cell log now
    assert sum(ticks) == len(examples) * len(first) and resumed.complete
    assert [c["setting"] for c in resumed.cells] == [s.label for s in first]
    for a, b in zip(resumed.cells, whole.cells, strict=True):
        assert [t["response"] for t in a["trials"]] == [t["response"] for t in b["trials"]]
        assert a["accuracy"] == b["accuracy"]


def test_a_shared_prefill_run_stopped_half_way_resumes_from_its_answered_examples(tiny_llama, tmp_path, monkeypatch):
    """Examples outer, settings inner: nothing is a whole cell until the last example, so the answers logged one
    by one are what a stopped run keeps; resumed, only the examples not answered get a prompt forward, and the
    result equals an uninterrupted run's."""
    import datasets

    from headprobe.eval import datasets as dataset_eval

    rows = {key: values * 2 for key, values in ROWS.items()} | {"_id": ["q1", "q2", "q3", "q4"]}
    examples = load_qa_dataset(datasets.Dataset.from_dict(rows))
    settings = expand_settings(["full", "snapkv[window=8]", "streaming"], [16])
    whole = run_dataset_eval(tiny_llama, examples, settings, tmp_path / "whole.json", max_length=200,
                             max_new_tokens=MAX_NEW, chat_template=False)
    forwards = []
    real = dataset_eval.record_prefill

    def counting(*args, **kwargs):
        forwards.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(dataset_eval, "record_prefill", counting)

    def stop_after_two_examples(_n):
        if len(forwards) == 3:
            raise KeyboardInterrupt

    out = tmp_path / "r.json"
    with pytest.raises(KeyboardInterrupt):
        run_dataset_eval(tiny_llama, examples, settings, out, max_length=200, max_new_tokens=MAX_NEW,
                         chat_template=False, progress=stop_after_two_examples)
    log = dataset_eval.example_log_path(out)
    assert len(log.read_text().splitlines()) == 1 + 2 * len(settings) + 1   # header, two examples, the third's first
    forwards.clear()
    resumed = run_dataset_eval(tiny_llama, examples, settings, out, max_length=200, max_new_tokens=MAX_NEW,
                               chat_template=False, resume=True)
    assert len(forwards) == len(examples) - 2           # the third example's other settings still needed its forward
    assert resumed.complete and not log.exists()
    for a, b in zip(resumed.cells, whole.cells, strict=True):
        assert [t["response"] for t in a["trials"]] == [t["response"] for t in b["trials"]]
        assert a["accuracy"] == b["accuracy"]
