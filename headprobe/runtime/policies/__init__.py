"""Token selection policies, one module each; :data:`POLICIES` maps the command-line names."""

from .base import LayerContext, Policy
from .full import Full
from .snapkv import SnapKV
from .streaming import Streaming

POLICIES: dict[str, type[Policy]] = {"full": Full, "snapkv": SnapKV, "streaming": Streaming}

__all__ = ["Full", "LayerContext", "POLICIES", "Policy", "SnapKV", "Streaming"]

from .keydiff import KeyDiff  # noqa: E402
from .morphkv import MorphKV  # noqa: E402

POLICIES.update({"keydiff": KeyDiff, "morphkv": MorphKV})
__all__ += ["KeyDiff", "MorphKV"]

from .keepkv import KeepKV  # noqa: E402

POLICIES["keepkv"] = KeepKV
__all__ += ["KeepKV"]

from .dynamickv import DynamicKV  # noqa: E402

POLICIES["dynamickv"] = DynamicKV
__all__ += ["DynamicKV"]
