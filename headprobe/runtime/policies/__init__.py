"""Token selection policies, one module each; :data:`POLICIES` maps the command-line names."""

from .base import LayerContext, Policy
from .full import Full
from .snapkv import SnapKV
from .streaming import Streaming

POLICIES: dict[str, type[Policy]] = {"full": Full, "snapkv": SnapKV, "streaming": Streaming}

__all__ = ["Full", "LayerContext", "POLICIES", "Policy", "SnapKV", "Streaming"]
