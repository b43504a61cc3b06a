"""The shape of a model (layers, heads, head_dim, layer types) without loading its weights.

Files that carry no model identity (a DuoAttention folder, a HeadKV score file, a kvpress ratio) are
explained for the model ``--model`` names. Its identity comes from its config alone; the two models
headprobe ships as GGUF packages come from the identity recorded in the shipped profiles made on them,
so that naming them converts nothing and needs no package installed.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import HeadprobeError, param
from ..files.jsonio import read_json
from ..models.identity import ModelIdentity
from ..models.loading import resolve_model
from ..paths import shipped_profiles_dir
from ..tool_files.known import identity_for_model


def shipped_identity(hf_id: str) -> ModelIdentity | None:
    """The identity of ``hf_id`` as a shipped profile records it (``None`` when none was made on it)."""
    for path in sorted(shipped_profiles_dir().glob("*.json")):
        try:
            block = read_json(path).get("model")
        except (HeadprobeError, AttributeError, OSError):
            continue
        if isinstance(block, dict) and block.get("name") == hf_id:
            return ModelIdentity.from_json(block, path)
    return None


def model_shape(model: str) -> ModelIdentity:
    """The identity of ``model`` (alias, Hugging Face id or folder), read without its weights.

    Raises
    ------
    HeadprobeError
        An unknown alias, a missing folder, or a hub model whose config is not in the local cache.
    """
    resolved = resolve_model(model)
    if resolved.spec is not None and resolved.spec.gguf_package:
        found = shipped_identity(resolved.spec.hf_id)
        if found is not None:
            return replace(found, source=resolved.source)
    found = identity_for_model(model)
    if found is None:
        raise HeadprobeError(f"{param('model', model)}: its config is not in the local Hugging Face cache and cannot "
                             "be downloaded (offline?); give a model folder or an alias")
    return found


__all__ = ("model_shape", "shipped_identity")
