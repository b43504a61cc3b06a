"""Models: aliases, loading, identity."""

from .identity import ModelIdentity, identity_from_config, text_config
from .loading import LoadedModel, load_model, model_identity, resolve_model
from .registry import DEFAULT_MODEL, MODELS, ModelSpec, model_slug

__all__ = ["DEFAULT_MODEL", "MODELS", "LoadedModel", "ModelIdentity", "ModelSpec", "identity_from_config",
           "load_model", "model_identity", "model_slug", "resolve_model", "text_config"]
