"""llama.cpp itself given headprobe's llama.cpp export for Gemma 3: its C++ loader and KV cache, run through
llama-cpp-python's bindings (the package builds llama.cpp from source; the test skips where it is not installed).

What the engine reports after loading is compared with what headprobe says it will do: the window it reads
(``llama_model_n_swa``), which layers it makes sliding (its ``is_swa`` line per layer), and the cells and bytes
it allocates for the global and the sliding layers (its ``llama_kv_cache`` lines), against the export file and
``headprobe explain``'s llama.cpp row (:func:`llama_cpp_allocation`).
"""

from __future__ import annotations

import re

import pytest

from headprobe.explain.engines.serving_windows import llama_cpp_allocation
from headprobe.explain.setting import Setting
from headprobe.layer_split import GLOBAL, LayerSplit
from headprobe.tool_files.engine_windows import llama_cpp_metadata
from tests.allocation.test_layer_split import GEMMA3
from tests.tool_files.conftest import gguf_with_metadata

pytestmark = pytest.mark.slow
llama_cpp = pytest.importorskip("llama_cpp")

NEW_TOKENS = 32


def _split(window: int, context: int) -> LayerSplit:
    layers = tuple(GLOBAL if i % 6 == 5 else window for i in range(GEMMA3.num_layers))
    return LayerSplit(model=GEMMA3, engine="llama.cpp", layers=layers, context=context)


def _load(path, row, **kwargs):
    """llama.cpp's model and context as the explain row runs them: ``-c`` prompt + answer, its ``n_ubatch``,
    sliding layers at their window (``swa_full`` off: llama-cli's default, not the C API's)."""
    return llama_cpp.Llama(str(path), n_ctx=row.extra["n_ctx"], n_ubatch=row.extra["n_ubatch"],
                           n_batch=row.extra["n_ubatch"], swa_full=False, n_threads=1, verbose=True, **kwargs)


def _engine_report(log: str, num_layers: int) -> dict:
    """What llama.cpp printed while loading: its per-layer sliding flags and its two caches."""
    is_swa = {int(i): flag == "1" for i, flag in re.findall(r"layer +(\d+) assigned to device \w+, is_swa = (\d)", log)}
    caches = {kind.strip(): int(cells) for kind, cells in
              re.findall(r"creating (non-SWA| +SWA) KV cache, size = (\d+) cells", log)}
    mib = [float(m) for m in re.findall(r"llama_kv_cache: size = +([\d.]+) MiB", log)]
    return {"is_swa": [is_swa[i] for i in range(num_layers)], "cells_global": caches["non-SWA"],
            "cells_swa": caches["SWA"], "bytes": round(sum(mib) * 2**20)}


@pytest.mark.parametrize(("window", "context"), [(128, 4000), (1000, 700)])
def test_llama_cpp_keeps_what_the_export_and_explain_say(gemma3_gguf, capfd, window, context):
    split = _split(window, context)
    export = llama_cpp_metadata(split)
    row = llama_cpp_allocation(split, GEMMA3, Setting(context, 1, "float16", NEW_TOKENS))
    capfd.readouterr()
    llm = _load(gemma3_gguf, row, kv_overrides=export["gguf_metadata"])
    report = _engine_report(capfd.readouterr().err, GEMMA3.num_layers)

    assert llama_cpp.llama_model_n_swa(llm.model) == window
    assert report["is_swa"] == [w != GLOBAL for w in split.layers]
    assert (report["cells_global"], report["cells_swa"]) == (row.extra["cells_global"], row.extra["cells_swa"])
    assert report["bytes"] == row.bytes_prefill == row.bytes_end       # float16 keys and values, llama.cpp's default
    assert llm.n_ctx() == row.extra["n_ctx"]


def test_the_gguf_edited_in_place_loads_with_the_window(gemma3_gguf, tmp_path, capfd):
    split = _split(256, 2048)
    copy = gguf_with_metadata(gemma3_gguf, tmp_path / "gemma3.gguf", llama_cpp_metadata(split)["gguf_metadata"])

    row = llama_cpp_allocation(split, GEMMA3, Setting(2048, 1, "float16", NEW_TOKENS))
    llm = _load(copy, row)                              # no override: the file itself holds the window
    report = _engine_report(capfd.readouterr().err, GEMMA3.num_layers)
    assert llama_cpp.llama_model_n_swa(llm.model) == 256
    assert (report["cells_global"], report["cells_swa"]) == (row.extra["cells_global"], row.extra["cells_swa"])


def test_without_swa_full_off_the_c_api_gives_sliding_layers_every_cell(gemma3_gguf, capfd):
    """The C API's default (``llama_context_default_params``) is ``swa_full = true``: a sliding layer then holds
    ``n_ctx`` cells and the split saves no memory. The export and the explain row say to turn it off."""
    split = _split(128, 4000)
    row = llama_cpp_allocation(split, GEMMA3, Setting(4000, 1, "float16", NEW_TOKENS))
    assert llama_cpp.llama_context_default_params().swa_full
    capfd.readouterr()
    llama_cpp.Llama(str(gemma3_gguf), n_ctx=row.extra["n_ctx"], n_threads=1, verbose=True,
                    kv_overrides=llama_cpp_metadata(split)["gguf_metadata"])
    report = _engine_report(capfd.readouterr().err, GEMMA3.num_layers)
    assert report["cells_swa"] == report["cells_global"] == row.extra["n_ctx"] > row.extra["cells_swa"]
    assert "swa_full=False" in llama_cpp_metadata(split)["usage"]
