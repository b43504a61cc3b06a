"""Models: aliases, loading, identity."""

from .identity import ModelIdentity, identity_from_config
from .loading import LoadedModel, load_model, model_identity, resolve_model
from .registry import DEFAULT_MODEL, MODELS, ModelSpec

__all__ = ["DEFAULT_MODEL", "MODELS", "LoadedModel", "ModelIdentity", "ModelSpec", "identity_from_config",
           "load_model", "model_identity", "resolve_model"]
