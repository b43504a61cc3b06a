"""``gate="auto"``: the likelihood gate for models under 1B parameters, the published gate from there on; the
choice is printed, and recorded in the trial log and the profile."""

from __future__ import annotations

import json

import pytest
import torch
from headprobe_cli.main import build_parser, main

from headprobe import HeadprobeError
from headprobe.probes.gates import AUTO_LIKELIHOOD_BELOW, check_gate, choose_gate

torch.set_num_threads(1)


def _parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_small_models_get_the_likelihood_gate(tiny_llama):
    choice = choose_gate("auto", tiny_llama)
    assert (choice.gate, choice.requested, choice.parameters) == ("likelihood", "auto", _parameters(tiny_llama.model))
    assert choice.settings() == {"gate_auto": {"parameters": choice.parameters,
                                               "likelihood_below": AUTO_LIKELIHOOD_BELOW}}
    assert choice.describe().startswith("likelihood (auto: ")


def test_large_models_get_the_published_gate():
    big = torch.nn.Linear(40_000, 25_000, bias=False, device="meta")     # 1e9 parameters, no memory
    assert _parameters(big) == AUTO_LIKELIHOOD_BELOW
    assert choose_gate("auto", big).gate == "published"
    assert choose_gate("auto", torch.nn.Linear(40_000, 24_999, bias=False, device="meta")).gate == "likelihood"


@pytest.mark.parametrize("gate", ["published", "likelihood"])
def test_a_named_gate_is_kept_and_not_marked_auto(tiny_llama, gate):
    choice = choose_gate(gate, tiny_llama)
    assert choice.gate == gate and choice.settings() == {}


def test_unknown_gate_is_refused():
    with pytest.raises(HeadprobeError, match=r"gate='strict': expected one of auto, published, likelihood"):
        check_gate("strict")


def test_profile_command_defaults_to_auto_and_says_which_gate(tmp_path, capsys):
    import conftest

    assert build_parser().parse_args(["profile"]).gate == "auto"
    conftest.save_tiny_llama(tmp_path / "tiny")
    out = tmp_path / "out"
    assert main(["profile", "--model", str(tmp_path / "tiny"), "--device", "cpu", "--probe", "retrieval_reasoning",
                 "--lengths", "300", "--depths", "1", "50", "--needles", "q01", "q02", "q03", "--no-chat-template",
                 "--out-dir", str(out)]) == 0
    captured = capsys.readouterr()
    assert "retrieval-reasoning gate: likelihood (auto: " in captured.err
    assert "trials passed the likelihood gate" in captured.out
    settings = json.loads((out / "tiny.reasoning.trials.jsonl").read_text().splitlines()[0])["settings"]
    assert settings["gate"] == "likelihood"
    assert settings["gate_auto"] == {"parameters": _parameters(conftest.make_tiny_llama().model), "likelihood_below": AUTO_LIKELIHOOD_BELOW}
    profile = json.loads((out / "tiny.retrieval_reasoning.json").read_text())
    assert profile["trials"]["gate"] == "likelihood" and profile["probe"]["gate_auto"] == settings["gate_auto"]
