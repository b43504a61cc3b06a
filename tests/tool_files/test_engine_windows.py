"""Layer splits exported for vLLM, TensorRT-LLM and llama.cpp: each file's content from a known split, and the
engines and architectures that cannot take one."""

from __future__ import annotations

import json

import pytest
from headprobe_cli.main import main

from headprobe.allocation.layer_split_choice import split_budget_map
from headprobe.errors import HeadprobeError
from headprobe.layer_split import GLOBAL, LayerSplit
from headprobe.tool_files.engine_windows import (
    llama_cpp_metadata,
    split_of,
    tensorrt_llm_config,
    vllm_overrides,
    write_engine_split,
)
from tests.allocation.test_layer_split import GEMMA3
from tests.conftest import SMOLLM2_IDENTITY

#: Layers 0, 3 and 29 global, the rest 256 (SmolLM2, 30 layers).
LAYERS = tuple(GLOBAL if i in (0, 3, 29) else 256 for i in range(30))


def smol_split(engine: str = "vllm", sink: int = 0, layers=LAYERS) -> LayerSplit:
    return LayerSplit(model=SMOLLM2_IDENTITY, engine=engine, layers=layers, sink=sink, context=4096)


def test_vllm_overrides_are_layer_types_and_one_window():
    out = vllm_overrides(smol_split())
    types = out["hf_overrides"]["layer_types"]
    assert out["hf_overrides"]["sliding_window"] == 256 and len(types) == 30
    assert [i for i, t in enumerate(types) if t == "full_attention"] == [0, 3, 29]
    assert set(types) == {"full_attention", "sliding_attention"}
    assert "llama.py" in out["read_by"] and "--hf-overrides" in out["usage"]
    keeps = out["keeps"]
    assert keeps["tokens_per_layer"] == [4096 if w == GLOBAL else 256 for w in LAYERS]
    assert keeps["bytes"] == (3 * 4096 + 27 * 256) * 2 * 3 * 64 * 2
    assert keeps["full_bytes"] == 30 * 4096 * 2 * 3 * 64 * 2
    assert keeps["share"] == pytest.approx((3 * 4096 + 27 * 256) / (30 * 4096), abs=1e-6)


def test_tensorrt_llm_windows_per_layer_and_the_sink():
    layers = tuple(GLOBAL if i == 5 else 64 + i for i in range(30))
    out = tensorrt_llm_config(smol_split("tensorrt-llm", sink=4, layers=layers))
    cfg = out["kv_cache_config"]
    full = SMOLLM2_IDENTITY.max_context or 4096
    assert cfg == {"max_attention_window": [full if i == 5 else 64 + i for i in range(30)], "sink_token_length": 4}
    assert out["keeps"]["tokens_per_layer"][5] == 4096 and out["keeps"]["tokens_per_layer"][6] == 70
    no_sink = tensorrt_llm_config(smol_split("tensorrt-llm"))
    assert "sink_token_length" not in no_sink["kv_cache_config"]


def test_llama_cpp_gemma3_window_key_and_its_fixed_pattern():
    layers = tuple(GLOBAL if i % 6 == 5 else 128 for i in range(18))
    out = llama_cpp_metadata(LayerSplit(model=GEMMA3, engine="llama.cpp", layers=layers, context=8192))
    assert out["gguf_metadata"] == {"gemma3.attention.sliding_window": 128}
    assert out["override_kv"] == ["gemma3.attention.sliding_window=int:128"]
    assert out["keeps"]["global_layers"] == [5, 11, 17]
    moved = tuple(GLOBAL if i in (0, 11, 17) else 128 for i in range(18))
    with pytest.raises(HeadprobeError, match=r"the gemma3 loader fixes the global layers at \[5, 11, 17\]"):
        llama_cpp_metadata(LayerSplit(model=GEMMA3, engine="llama.cpp", layers=moved, context=8192))


def test_refusals_for_engines_and_architectures_that_cannot_take_the_split():
    with pytest.raises(HeadprobeError, match="--to llama.cpp: llama.cpp's llama loader reads no sliding-window key"):
        llama_cpp_metadata(smol_split("llama.cpp"))
    gemma = LayerSplit(model=GEMMA3, engine="vllm", layers=tuple(GLOBAL if i % 6 == 5 else 256 for i in range(18)),
                       context=8192)
    with pytest.raises(HeadprobeError, match="--to vllm: vLLM's gemma3_text model does not build per-layer windows"):
        vllm_overrides(gemma)
    with pytest.raises(HeadprobeError, match="--to vllm: the split was made for tensorrt-llm"):
        vllm_overrides(smol_split("tensorrt-llm"))
    mixed = tuple(GLOBAL if i == 0 else 128 + (i % 2) for i in range(30))
    with pytest.raises(HeadprobeError, match=r"windows \[128, 129\]; vllm takes one window"):
        vllm_overrides(smol_split("vllm", layers=mixed))


def test_export_reads_split_files_and_split_maps(tmp_path, capsys):
    split = smol_split()
    path = split.save(tmp_path / "split.json")
    map_path = split_budget_map(split).save(tmp_path / "map.json")
    assert split_of(split_budget_map(split), "vllm").layers == LAYERS
    for i, src in enumerate((path, map_path)):
        out = tmp_path / f"v{i}.json"
        assert main(["export", str(src), "--to", "vllm", "-o", str(out)]) == 0
        data = json.loads(out.read_text())
        assert data["format"] == "headprobe.engine_split" and data["hf_overrides"]["sliding_window"] == 256
    assert "vllm keeps 14,745,600 of 94,371,840 bytes (15.6%) at 4096 tokens; global layers [0, 3, 29]" in capsys.readouterr().out
    assert main(["export", str(path), "--to", "llama.cpp", "-o", str(tmp_path / "l.json")]) == 2
    assert "the split was made for vllm" in capsys.readouterr().err
    assert not (tmp_path / "l.json").exists()
    with pytest.raises(HeadprobeError, match="exists"):
        write_engine_split(split, "vllm", tmp_path / "v0.json")
