"""The converted-model cache is never silently wrong: a conversion is keyed by what decides its content
(the GGUF, the package that ships it, transformers, gguf, headprobe's converter), and every load checks that
the converted tokenizer tokenizes as the GGUF's own tokenizer did; a folder that does not is converted
again, or refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from headprobe import HeadprobeError
from headprobe.models import loading
from headprobe.models.registry import MODELS

SMOLLM2 = MODELS["smollm2-135m"]


def _real_conversion(smollm2):
    """The conversion folder the session's SmolLM2 was loaded from (made by this environment)."""
    folder = loading.conversion_folder(SMOLLM2, loading._gguf_path(SMOLLM2))
    assert (folder / loading.SOURCE_FILE).exists()
    return folder


def _stale_copy(source, target):
    """A copy of a conversion whose tokenizer config names the class an older transformers wrote for SmolLM2
    (CodeLlamaTokenizer), which the newest transformers loads as a tokenizer that turns spaces into
    ``<|endoftext|>``; the weights are linked, not copied."""
    target.mkdir(parents=True)
    for item in source.iterdir():
        if item.suffix == ".safetensors":
            os.symlink(item, target / item.name)
        else:
            shutil.copy(item, target / item.name)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "CodeLlamaTokenizer"
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


def test_a_conversion_is_keyed_by_the_transformers_that_made_it(monkeypatch):
    import transformers

    gguf = loading._gguf_path(SMOLLM2)
    here = loading.conversion_folder(SMOLLM2, gguf)
    monkeypatch.setattr(transformers, "__version__", "5.2.0")
    other = loading.conversion_folder(SMOLLM2, gguf)
    assert other != here and other.parent == here.parent
    monkeypatch.setattr(loading, "CONVERTER_VERSION", loading.CONVERTER_VERSION + 1)
    assert loading.conversion_folder(SMOLLM2, gguf) not in (here, other)


@pytest.mark.slow
def test_the_tokenizer_check_tells_a_stale_conversion(smollm2, tmp_path):
    from transformers import AutoTokenizer

    real = _real_conversion(smollm2)
    assert loading.tokenizer_mismatch(real, smollm2.tokenizer) is None
    stale = _stale_copy(real, tmp_path / "stale")
    tokenizer = AutoTokenizer.from_pretrained(stale)
    assert "tokens where the GGUF's gave" in loading.tokenizer_mismatch(stale, tokenizer)


@pytest.mark.slow
def test_a_stale_conversion_in_the_cache_is_converted_again(smollm2, tmp_path):
    """A folder in the cache whose tokenizer differs from the GGUF's (another environment wrote or edited it)
    is converted again, with one line saying so; the model then tokenizes as the GGUF does."""
    real = _real_conversion(smollm2)
    env = {**os.environ, "HEADPROBE_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    code = ("from headprobe.models import loading as l; from headprobe.models.registry import MODELS; "
            "s = MODELS['smollm2-135m']; print(l.conversion_folder(s, l._gguf_path(s)))")
    where = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    _stale_copy(real, Path(where.stdout.strip()))
    code = ("import headprobe as hp; lm = hp.load_model('smollm2-135m', device='cpu'); "
            f"print(lm.tokenizer({loading.TOKENIZER_CHECK_TEXT!r}, add_special_tokens=False).input_ids)")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                         check=False)
    assert run.returncode == 0, run.stderr
    expected = smollm2.tokenizer(loading.TOKENIZER_CHECK_TEXT, add_special_tokens=False).input_ids
    assert json.loads(run.stdout.strip()) == expected
    assert "does not tokenize as HuggingFaceTB/SmolLM2-135M-Instruct's GGUF" in run.stderr
    assert "converting it again" in run.stderr


@pytest.mark.slow
def test_a_conversion_that_stays_wrong_is_refused(smollm2, tmp_path, monkeypatch):
    stale = _stale_copy(_real_conversion(smollm2), tmp_path / "stale")
    monkeypatch.setattr(loading, "_converted_gguf", lambda spec, again=False: stale)
    with pytest.raises(HeadprobeError, match=r"smollm2-135m.?: the tokenizer transformers converts .* does not "
                                             r"tokenize as the GGUF"):
        loading.load_model("smollm2-135m", device="cpu")
