"""A transformers that reads a packaged GGUF wrong (older than the model's ``min_transformers``) reads the
conversion another environment sharing the cache made with one that reads it right, and never makes its own."""

from __future__ import annotations

import json

import pytest

from headprobe.errors import HeadprobeError
from headprobe.models import loading
from headprobe.models.registry import MODELS

GEMMA = MODELS["gemma3-270m"]


def _conversion(cache, name, transformers="5.25.0", package=None, converter=loading.CONVERTER_VERSION,
                weights=True):
    folder = cache / "models" / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    if weights:
        (folder / "model.safetensors").write_bytes(b"")
    package = package or f"{GEMMA.gguf_package} {loading._version_of(GEMMA.gguf_package)}"
    (folder / loading.SOURCE_FILE).write_text(json.dumps(
        {"hf_id": GEMMA.hf_id, "package": package, "transformers": transformers, "converter": converter}))
    return folder


@pytest.fixture
def old_transformers(monkeypatch, tmp_path):
    import transformers

    monkeypatch.setenv("HEADPROBE_CACHE", str(tmp_path))
    monkeypatch.setattr(transformers, "__version__", "5.2.0")
    return tmp_path


def test_the_newest_conversion_made_by_a_transformers_that_reads_the_gguf_right_is_borrowed(old_transformers):
    cache = old_transformers
    assert loading.borrowed_conversion(GEMMA) is None
    _conversion(cache, "gemma3-270m-a", transformers="5.2.0")                    # made by one that reads it wrong
    _conversion(cache, "gemma3-270m-b", package=f"{GEMMA.gguf_package} 0.0.1")  # another release of the GGUF
    _conversion(cache, "gemma3-270m-c", converter=loading.CONVERTER_VERSION - 1)
    _conversion(cache, "gemma3-270m-d", weights=False)                          # a conversion cut short
    _conversion(cache, "smollm2-135m-e")                                        # another model
    assert loading.borrowed_conversion(GEMMA) is None
    with pytest.raises(HeadprobeError, match=r"transformers 5\.2\.0 reads this GGUF's tokenizer without its "
                                             r"merges.*or load the model once in an environment that has it"):
        loading.check_transformers_for(GEMMA)
    older = _conversion(cache, "gemma3-270m-f", transformers="5.18.0")
    assert loading.borrowed_conversion(GEMMA) == older
    newest = _conversion(cache, "gemma3-270m-g", transformers="5.25.0")
    assert loading.borrowed_conversion(GEMMA) == newest
    loading.check_transformers_for(GEMMA)                                       # no refusal now
    with pytest.raises(HeadprobeError, match="transformers 5.2.0"):             # a version asked about is not
        loading.check_transformers_for(GEMMA, "5.2.0")                         # the installed one


def test_an_old_transformers_reads_the_borrowed_folder_and_never_converts(old_transformers, monkeypatch, capsys):
    borrowed = _conversion(old_transformers, "gemma3-270m-x")
    monkeypatch.setattr(loading, "_gguf_path", lambda spec: pytest.fail("converted here"))
    assert loading._converted_gguf(GEMMA) == borrowed
    assert loading._converted_gguf(GEMMA, again=True) == borrowed    # a tokenizer mismatch does not convert
    assert capsys.readouterr().err.count(str(borrowed)) == 1         # named once a process


def test_a_borrowed_tokenizer_that_still_tokenizes_wrong_is_refused(old_transformers, monkeypatch):
    folder = _conversion(old_transformers, "gemma3-270m-y")
    source = json.loads((folder / loading.SOURCE_FILE).read_text())
    source["tokenizer_check"] = {"text": "a b", "ids": [1, 2]}
    (folder / loading.SOURCE_FILE).write_text(json.dumps(source))

    class Tokenizer:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [7]}

    with pytest.raises(HeadprobeError, match="does not tokenize as the GGUF"):
        loading._checked_gguf_tokenizer(GEMMA, "gemma3-270m", folder, lambda f: Tokenizer())


def test_a_load_looks_for_a_conversion_to_borrow_once(old_transformers, monkeypatch):
    lookups, read = [], []
    borrowed = loading.borrowed_conversion
    monkeypatch.setattr(loading, "borrowed_conversion", lambda spec: lookups.append(spec) or borrowed(spec))
    monkeypatch.setattr(loading, "_gguf_path", lambda spec: pytest.fail("converted here"))

    def read_model(auto, resolved, model, path, *args):
        read.append(path)
        raise HeadprobeError("stop before the weights")

    monkeypatch.setattr(loading, "_read_model", read_model)
    with pytest.raises(HeadprobeError, match=r"transformers 5\.2\.0 reads this GGUF's tokenizer without its merges"):
        loading.load_model("gemma3-270m", device="cpu")           # none to borrow: refused, nothing read
    assert lookups == [GEMMA] and read == []
    folder = _conversion(old_transformers, "gemma3-270m-y")
    lookups.clear()
    with pytest.raises(HeadprobeError, match="stop before the weights"):
        loading.load_model("gemma3-270m", device="cpu")
    assert lookups == [GEMMA] and read == [str(folder)]            # one lookup, and its folder is what is read
