"""The llama.cpp export applied to Gemma 3's own GGUF with llama.cpp's GGUF tools (gguf-py, the ``gguf``
package that llama.cpp's repository ships), then read back by gguf-py and by transformers' GGUF loader.

llama.cpp's C++ loader is not installed here; what this shows is that every key the export names is one the
model's file already holds, with the type llama.cpp wrote it in, and that the value lands where readers of the
file find it (``gguf_set_metadata`` is the tool llama.cpp documents for changing one key of a GGUF in place).
"""

from __future__ import annotations

import pytest

from headprobe.layer_split import GLOBAL, LayerSplit
from headprobe.tool_files.engine_windows import llama_cpp_metadata
from tests.allocation.test_layer_split import GEMMA3
from tests.tool_files.conftest import gguf_with_metadata

pytestmark = pytest.mark.slow


def test_the_export_written_into_gemma3s_gguf_is_what_its_readers_find(gemma3_gguf, tmp_path):
    gguf = pytest.importorskip("gguf")
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    window = 128                                       # Gemma 3's own is 512
    layers = tuple(GLOBAL if i % 6 == 5 else window for i in range(18))
    export = llama_cpp_metadata(LayerSplit(model=GEMMA3, engine="llama.cpp", layers=layers, context=8192))
    shipped = gguf.GGUFReader(gemma3_gguf)
    for key in export["gguf_metadata"]:
        field = shipped.get_field(key)
        assert field is not None, f"{key}: not a key of the model's file"
        assert field.types == [gguf.GGUFValueType.UINT32] and field.contents() == 512
    copy = gguf_with_metadata(gemma3_gguf, tmp_path / "gemma3.gguf", export["gguf_metadata"])

    reader = gguf.GGUFReader(copy)
    assert {key: reader.get_field(key).contents() for key in export["gguf_metadata"]} == export["gguf_metadata"]
    config = load_gguf_checkpoint(str(copy), return_tensors=False)["config"]
    assert config["sliding_window"] == window
    assert gguf.GGUFReader(gemma3_gguf).get_field(
        "gemma3.attention.sliding_window").contents() == 512     # the shipped file is untouched
