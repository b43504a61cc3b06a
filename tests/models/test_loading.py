"""Model resolution and loading: aliases, remote code, devices, errors in the caller's spelling."""

from __future__ import annotations

import json

import pytest
import torch

import headprobe
from headprobe import HeadprobeError


def test_unknown_alias_suggests_close_matches():
    with pytest.raises(HeadprobeError, match="did you mean smollm2-135m"):
        headprobe.resolve_model("smolm2-135m")


def test_remote_code_refused_without_flag(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "auto_map": {"AutoModel": "x.Y"}}))
    with pytest.raises(HeadprobeError, match="pass trust_remote_code=True if you trust it"):
        headprobe.load_model(str(tmp_path), device="cpu")
    with headprobe.frontend.flag_spelling({}), pytest.raises(HeadprobeError, match=r"^--model \S+: .* pass --trust-remote-code"):
        headprobe.load_model(str(tmp_path), device="cpu")


def test_loading_onto_the_device_keeps_the_weights(tiny_dir):
    from transformers import AutoModelForCausalLM

    lm = headprobe.load_model(str(tiny_dir), device="cpu")
    plain = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    assert lm.device.type == "cpu" and lm.model.dtype == torch.float32
    ids = torch.randint(3, 300, (1, 20))
    assert torch.equal(lm.model(ids).logits, plain(ids).logits)


def test_a_large_model_landing_on_the_cpu_warns_why(tiny_dir, monkeypatch):
    import warnings

    from headprobe.models import loading

    monkeypatch.setattr(loading, "LARGE_ON_CPU", 1)   # the tiny model counts as large
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        headprobe.load_model(str(tiny_dir), device="cpu")        # asked for: no warning
    if torch.cuda.is_available():
        pytest.skip("a GPU is available: the default device is not the CPU")
    with pytest.warns(RuntimeWarning, match=r"is on the CPU: .*CUDA.*pass device='cpu' to use the CPU on purpose"):
        headprobe.load_model(str(tiny_dir))
    monkeypatch.setattr(loading, "LARGE_ON_CPU", 10**12)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        headprobe.load_model(str(tiny_dir))                        # small models load quietly


def test_model_errors_name_parameters_in_the_callers_spelling(tmp_path):
    with pytest.raises(HeadprobeError, match=r"^dtype='float64': expected one of auto, float32"):
        headprobe.load_model("smollm2-135m", dtype="float64")
    with pytest.raises(HeadprobeError, match=r"^model='\./nosuch': no such directory"):
        headprobe.resolve_model("./nosuch")
    with headprobe.frontend.flag_spelling({}), pytest.raises(HeadprobeError, match=r"^--dtype float64: expected"):
        headprobe.load_model("smollm2-135m", dtype="float64")
