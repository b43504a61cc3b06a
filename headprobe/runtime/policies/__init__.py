"""Token selection policies, one module each; :data:`POLICIES` maps the command-line names."""

from .base import LayerContext, Policy
from .full import Full
from .snapkv import SnapKV
from .streaming import Streaming

POLICIES: dict[str, type[Policy]] = {"full": Full, "snapkv": SnapKV, "streaming": Streaming}

__all__ = ["POLICIES", "Full", "LayerContext", "Policy", "SnapKV", "Streaming"]

from .keydiff import KeyDiff
from .morphkv import MorphKV

POLICIES.update({"keydiff": KeyDiff, "morphkv": MorphKV})
__all__ += ["KeyDiff", "MorphKV"]

from .keepkv import KeepKV

POLICIES["keepkv"] = KeepKV
__all__ += ["KeepKV"]

from .dynamickv import DynamicKV

POLICIES["dynamickv"] = DynamicKV
__all__ += ["DynamicKV"]
