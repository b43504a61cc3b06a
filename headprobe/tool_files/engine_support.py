"""Which architectures each serving engine can run a layer split on, as read in the engine's code.

A split only reaches an engine through what its model code or loader reads: vLLM's model class must build
its per-layer sliding window from ``config.layer_types``; llama.cpp's loader must read the window (and the
per-layer pattern, where a split changes it) from the GGUF metadata; TensorRT-LLM takes the windows at
run time (``KvCacheConfig.max_attention_window``) whatever the architecture. Architectures are the
``model_type`` a model identity records. The citations are repeated in ``docs/interop.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import HeadprobeError
from ..layer_split import GLOBAL, LayerSplit


@dataclass(frozen=True)
class LlamaCppArch:
    """How llama.cpp's loader reads sliding windows for one architecture.

    Attributes
    ----------
    gguf_arch
        The GGUF architecture name (the metadata keys' prefix).
    global_every
        The fixed period of global layers (``set_swa_pattern(n)``: layer ``il`` is global when
        ``il % n == n - 1``); the split must keep exactly those layers global.
    """

    gguf_arch: str
    global_every: int


#: vLLM model_types whose model class reads ``layer_types`` + ``sliding_window`` per layer.
VLLM_LAYER_TYPES = {
    "llama": "vllm-project/vllm@e06c9ba vllm/model_executor/models/llama.py (LlamaAttention.__init__: "
             "layer_types[layer] == 'sliding_attention' -> per_layer_sliding_window = config.sliding_window)",
}
#: vLLM model classes read and found not to take per-layer windows from ``layer_types``.
VLLM_NOT_READ = {
    "gemma3_text": "vllm-project/vllm@311a97c vllm/model_executor/models/gemma3.py (the window comes from "
                   "interleaved_sliding_window and the fixed sliding_window_pattern, not layer_types)",
    "qwen2": "vllm-project/vllm@cb24295 vllm/model_executor/models/qwen2.py (Qwen2Attention takes no window; "
             "a sliding window on some layers only is refused)",
}
#: llama.cpp architectures whose loader reads the window key (src/llama-model.cpp, load_hparams).
LLAMA_CPP_ARCHS = {"gemma3_text": LlamaCppArch("gemma3", 6), "gemma3": LlamaCppArch("gemma3", 6)}
LLAMA_CPP_SOURCE = ("ggml-org/llama.cpp src/llama-model.cpp load_hparams: LLM_ARCH_GEMMA3 reads "
                    "LLM_KV_ATTENTION_SLIDING_WINDOW into n_swa and fixes set_swa_pattern(6); LLM_ARCH_LLAMA, "
                    "LLM_ARCH_QWEN2 read no sliding-window key")


def check_engine(split: LayerSplit, engine: str) -> None:
    """Refuse a split made for another engine (its constraints differ)."""
    if split.engine != engine:
        raise HeadprobeError(f"--to {engine}: the split was made for {split.engine} (its windows follow that "
                             f"engine's rule); make it with --engine {engine}")


def check_vllm_arch(split: LayerSplit) -> str:
    """The citation of the vLLM model code that reads the split, or a refusal naming what was read."""
    arch = split.model.architecture
    if arch in VLLM_LAYER_TYPES:
        return VLLM_LAYER_TYPES[arch]
    seen = f" (read: {VLLM_NOT_READ[arch]})" if arch in VLLM_NOT_READ else ""
    raise HeadprobeError(f"--to vllm: vLLM's {arch} model does not build per-layer windows from layer_types{seen}; "
                         f"supported: {', '.join(VLLM_LAYER_TYPES)}")


def check_llama_cpp_arch(split: LayerSplit) -> LlamaCppArch:
    """The loader rule of the split's architecture, once the split keeps its fixed pattern of global layers.

    Raises
    ------
    HeadprobeError
        An architecture whose loader reads no window key, or a split whose global layers differ from the
        loader's fixed pattern.
    """
    arch = split.model.architecture
    rule = LLAMA_CPP_ARCHS.get(arch)
    if rule is None:
        raise HeadprobeError(f"--to llama.cpp: llama.cpp's {arch} loader reads no sliding-window key, so no "
                             f"metadata changes what it keeps ({LLAMA_CPP_SOURCE})")
    fixed = [i for i in range(split.model.num_layers) if i % rule.global_every == rule.global_every - 1]
    if split.global_layers != fixed:
        raise HeadprobeError(f"--to llama.cpp: the {rule.gguf_arch} loader fixes the global layers at {fixed} "
                             f"(every {rule.global_every}th); the split keeps {split.global_layers} global")
    return rule


def one_window(split: LayerSplit) -> int:
    """The one window of a split's local layers (vLLM, llama.cpp)."""
    windows = sorted({int(w) for w in split.layers if w != GLOBAL})
    if len(windows) > 1:
        raise HeadprobeError(f"the split gives its local layers windows {windows}; {split.engine} takes one window")
    return windows[0] if windows else split.context


__all__ = ("LLAMA_CPP_ARCHS", "LLAMA_CPP_SOURCE", "VLLM_LAYER_TYPES", "VLLM_NOT_READ", "LlamaCppArch", "check_engine",
           "check_llama_cpp_arch", "check_vllm_arch", "one_window")
