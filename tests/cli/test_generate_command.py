"""``headprobe generate`` parses options and reports errors in one line (no model load needed)."""

from __future__ import annotations

import dataclasses

import pytest
from headprobe_cli.main import main

from headprobe.runtime.policies import POLICIES

#: snapkv's options as its dataclass declares them (the message lists them in that order).
SNAPKV_OPTIONS = ", ".join(f.name for f in dataclasses.fields(POLICIES["snapkv"]))


def test_generate_rejects_an_option_the_policy_does_not_have(capsys):
    assert main(["generate", "--policy", "snapkv", "--option", "block_size=3", "hello"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [("headprobe: error: policy snapkv: option 'block_size' does not apply "
                    f"(options: {SNAPKV_OPTIONS})")]


@pytest.mark.parametrize("option, message", [
    ("pooling=median", "policy snapkv: pooling 'median': expected max or avg"),
    ("kernel_size=6", "policy snapkv: kernel_size 6: expected an odd positive integer"),
    ("window=8.5", "policy snapkv: option window=8.5: expected an integer"),
    ("adaptive=yes", "policy snapkv: option adaptive='yes': expected true or false"),
    ("window=0", "policy snapkv: window 0: expected at least 1"),
])
def test_generate_rejects_option_values_that_do_not_fit(option, message, capsys):
    assert main(["generate", "--policy", "snapkv", "--option", option, "hello"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"headprobe: error: {message}"]


def test_generate_rejects_a_bad_budget_file(tmp_path, capsys):
    bad = tmp_path / "b.json"
    bad.write_text('{"format": "headprobe.profile", "version": 1}')
    assert main(["generate", "--budget", str(bad), "hello"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0]


def test_generate_help_has_an_example(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "headprobe generate --capacity 128" in capsys.readouterr().out


@pytest.mark.slow
def test_generate_prints_answer_and_cache_line(capsys):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rc = main(["generate", "--capacity", "64", "--policy", "snapkv", "--max-new-tokens", "12", "--device", "cpu",
                   "What is the capital of France? Answer in one word."])
    finally:
        torch.set_num_threads(before)
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0
    assert "Paris" in out[0]
    assert out[-1].startswith("cache: ") and "vs full cache" in out[-1]


def _prompt_tokens(model_dir, text: str) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(model_dir)(text)["input_ids"])


def test_generate_refuses_a_prompt_beyond_the_models_context(tiny_dir, tmp_path, capsys):
    text = "The river ran past the old mill while the rain came down. " * 700
    tokens = _prompt_tokens(tiny_dir, text)
    assert tokens > 4096                                     # the tiny model's context
    prompt = tmp_path / "doc.txt"
    prompt.write_text(text)
    argv = ["generate", "--model", str(tiny_dir), "--device", "cpu", "--no-chat", "--prompt-file", str(prompt)]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        (f"headprobe: error: --prompt-file {prompt}: {tokens:,} prompt tokens + 64 new tokens (--max-new-tokens) "
         "exceed tiny's context of 4,096 tokens; shorten the prompt or generate fewer tokens")]


def test_generate_counts_the_new_tokens_against_the_context(tiny_dir, capsys):
    text = "The river ran past the old mill while the rain came down. " * 10
    tokens = _prompt_tokens(tiny_dir, text)
    argv = ["generate", "--model", str(tiny_dir), "--device", "cpu", "--no-chat", text]
    assert main([*argv, "--max-new-tokens", str(4096 - tokens + 1)]) == 2
    assert "the prompt: " in capsys.readouterr().err
    assert main([*argv, "--max-new-tokens", "4"]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("chat", [False, True])
def test_the_context_check_counts_the_tokens_generate_feeds_the_model(smollm2, chat):
    from headprobe_cli.cmd_generate import prompt_token_count

    import headprobe

    prompt = "Where did the river run? " * 20
    res = headprobe.generate_compressed(smollm2, prompt, capacity=32, max_new_tokens=1, chat=chat)
    assert prompt_token_count(smollm2, prompt, chat) == int(res.cache.prompt_lengths[0])


def test_generate_refuses_a_ratio_out_of_range_before_the_model_loads(monkeypatch, capsys):
    from headprobe.models import loading

    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(loading, "load_model", load_model)
    assert main(["generate", "--ratio", "2", "hello"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["headprobe: error: --ratio 2.0: expected a number in (0, 1]"]


def test_generate_refuses_a_chat_prompt_for_a_tokenizer_without_a_chat_template(tiny_dir, capsys):
    assert main(["generate", "--model", str(tiny_dir), "--device", "cpu", "--prompt-format", "chat", "hello"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        ("headprobe: error: --prompt-format chat: the model's tokenizer has no chat template (a base model); use "
         "--prompt-format plain or --prompt-format auto")]
    # auto (the default) gives such a model the prompt as written
    assert main(["generate", "--model", str(tiny_dir), "--device", "cpu", "--max-new-tokens", "2", "hello"]) == 0
