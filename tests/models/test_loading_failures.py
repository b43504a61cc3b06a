"""A model that cannot be loaded ends in one line: a weight file cut short, a Hub that refuses or fails (told
by one request, not by a minute of retries)."""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest

import headprobe
from headprobe import HeadprobeError
from headprobe.models import loading

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("keep", [100, 5])
def test_a_truncated_weights_file_is_one_line(tiny_dir, tmp_path, keep, capsys):
    from headprobe_cli.main import main

    folder = tmp_path / "m"
    shutil.copytree(tiny_dir, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:keep])
    with pytest.raises(HeadprobeError, match=rf"^model='{folder}': cannot load \(Error while deserializing header"):
        headprobe.load_model(str(folder), device="cpu")
    assert main(["generate", "--model", str(folder), "--device", "cpu", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"headprobe: error: --model {folder}: cannot load (")


class _Hub(http.server.BaseHTTPRequestHandler):
    status = 503
    requests: ClassVar[list[str]] = []

    def do_HEAD(self):
        type(self).requests.append(self.requestline)
        self.send_response(self.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD

    def log_message(self, *args):
        pass


@pytest.fixture
def hub():
    """A Hub that answers every request with ``_Hub.status``."""
    _Hub.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("status, why", [(503, "the Hub answered 503: a server error; try again later"),
                                         (403, "the Hub answered 403: the token has no access to this model"),
                                         (401, "the Hub answered 401: the model is private or gated")])
def test_a_hub_that_cannot_serve_the_model_is_told_at_once(hub, tmp_path, status, why):
    _Hub.status = status
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN")}
    env.update(HF_ENDPOINT=hub, HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_TELEMETRY="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "cli"), env.get("PYTHONPATH", "")]))
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "headprobe", "generate", "--model", "mistral-7b", "--device", "cpu",
                          "hi"], env=env, capture_output=True, text=True, timeout=40, check=False)
    elapsed = time.monotonic() - start
    assert run.returncode == 2
    errors = [x for x in run.stderr.splitlines() if x.startswith("headprobe: error:")]
    assert len(errors) == 1, run.stderr[-3000:]
    assert errors[0].startswith("headprobe: error: --model mistral-7b: cannot load mistralai/Mistral-7B-Instruct-v0.2 "
                                f"from the Hugging Face Hub ({why}")
    assert errors[0].endswith("no copy is in the local cache (HF_HUB_OFFLINE=1 uses cached models only)")
    assert len([r for r in _Hub.requests if "config.json" in r]) == 1, _Hub.requests   # asked once, no retries
    assert elapsed < 30


def test_a_cached_model_is_read_from_the_cache_when_the_hub_fails(hub, monkeypatch):
    from huggingface_hub import constants

    _Hub.status = 503
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "is_offline_mode", lambda: False, raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", hub)
    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache", lambda repo, name: "/cache/config.json")
    resolved = loading.ResolvedModel("org/model", "hub:org/model", "org/model")
    with pytest.warns(RuntimeWarning, match="the Hub answered 503: a server error; try again later; loading the "
                                            "copy in the local cache"):
        assert loading.check_hub_access(resolved, "org/model") is True
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "is_offline_mode", lambda: True, raising=False)
    assert loading.check_hub_access(resolved, "org/model") is False          # offline: nothing is asked
    assert len([r for r in _Hub.requests if "config.json" in r]) == 1


def test_a_transformers_that_reads_gemmas_tokenizer_wrong_is_refused_before_anything_loads(monkeypatch, tmp_path):
    import transformers

    from headprobe.models.registry import MODELS

    monkeypatch.setenv("HEADPROBE_CACHE", str(tmp_path))      # no conversion made by another environment

    gemma = MODELS["gemma3-270m"]
    loading.check_transformers_for(gemma, "5.18.0")
    loading.check_transformers_for(MODELS["smollm2-135m"], "5.0.0")        # read right by every 5.x
    monkeypatch.setattr(transformers, "__version__", "5.17.0")
    monkeypatch.setattr(loading, "_read_model", lambda *a, **k: pytest.fail("weights read"))
    with pytest.raises(HeadprobeError, match=r"model='gemma3-270m': transformers 5.17.0 reads this GGUF's tokenizer "
                                             r"without its merges.*install transformers>=5.18.0"):
        headprobe.load_model("gemma3-270m", device="cpu")


@pytest.mark.slow
def test_gemmas_tokenizer_keeps_whole_the_words_its_vocabulary_holds_whole(gemma3):
    # what older transformers got wrong (the refusal above): a word the vocabulary holds whole is one token
    tok = gemma3.tokenizer
    vocab = tok.get_vocab()
    words = ["▁the", "▁code", "▁harbour", "▁vault"]
    assert all(w in vocab for w in words)
    pieces = tok.convert_ids_to_tokens(tok("The code of the harbour vault is 4817.", add_special_tokens=False)
                                       ["input_ids"])
    assert all(w in pieces for w in words), pieces
