"""``--prompt-format {auto,chat,plain}`` on profile, eval, ablate, generate and tune, beside the older switches."""

from __future__ import annotations

import json

import pytest
import torch
from headprobe_cli.main import main

torch.set_num_threads(1)

#: Each command with the smallest arguments that reach the model (the tiny model has no chat template).
COMMANDS = {
    "profile": (["profile", "--probe", "retrieval", "--lengths", "300", "--depths", "50", "--needles", "r01"],
                "--no-chat-template"),
    "eval": (["eval", "--settings", "full", "--lengths", "300", "--depths", "50", "--needle-ids", "r01",
              "--max-new-tokens", "2", "--plot", "none"], "--no-chat-template"),
    "ablate": (["ablate", "--lengths", "300", "--depths", "50", "--needle-ids", "r01", "--plot", "none"],
               "--no-chat-template"),
    "generate": (["generate", "--capacity", "16", "--max-new-tokens", "2", "hello"], "--no-chat"),
    "tune": (["tune", "--capacities", "16", "--lengths", "300", "--depths", "50", "--needle-ids", "r01", "r02",
              "--holdout-ids", "r02", "--policies", "snapkv", "--allocations", "uniform", "--values", "window=8",
              "kernel_size=7", "pooling=max", "--no-preset-candidates", "--presets", "full", "--max-new-tokens", "2",
              "--plot", "none"], "--no-chat-template"),
}


def _error_lines(capsys) -> list[str]:
    return [x for x in capsys.readouterr().err.splitlines() if "headprobe: error:" in x]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_chat_together_with_the_older_plain_switch_is_refused_before_the_model_loads(command, tmp_path, capsys,
                                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv, plain_switch = COMMANDS[command]
    assert main([*argv, "--model", str(tmp_path / "no-such-model"), "--prompt-format", "chat", plain_switch]) == 2
    expected = f"headprobe: error: --prompt-format chat and {plain_switch} contradict each other; give one of them"
    assert _error_lines(capsys) == [expected]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_chat_for_a_model_without_a_chat_template_is_refused(command, tiny_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv, _ = COMMANDS[command]
    assert main([*argv, "--model", str(tiny_dir), "--prompt-format", "chat"]) == 2
    expected = ("headprobe: error: --prompt-format chat: the model's tokenizer has no chat template (a base model); "
                "use --prompt-format plain or --prompt-format auto")
    assert _error_lines(capsys) == [expected]
    assert not list(tmp_path.rglob("*.jsonl"))                    # refused before any trial


def test_eval_records_the_form_the_flags_ask_for(tiny_dir, tmp_path, capsys):
    argv, _ = COMMANDS["eval"]
    for extra in ([], ["--prompt-format", "plain"], ["--no-chat-template"]):
        out = tmp_path / f"e{len(extra)}.json"
        assert main([*argv, "--model", str(tiny_dir), "--out", str(out), *extra]) == 0
        assert json.loads(out.read_text())["prompt_format"] == "plain"
    capsys.readouterr()


def test_generate_renders_a_model_without_a_chat_template_as_plain_text(tiny_dir, capsys):
    """``auto`` needs no switch for a base model (the chat template was applied unasked before)."""
    argv, _ = COMMANDS["generate"]
    for extra in ([], ["--no-chat"], ["--prompt-format", "plain"]):
        assert main([*argv, "--model", str(tiny_dir), *extra]) == 0
        assert "vs full cache" in capsys.readouterr().out
