"""Token selection policies, one module each; :data:`POLICIES` maps the names ``make_policy`` accepts."""

from .base import LayerContext, Policy, Rebalance, ScorerPolicy
from .dynamickv import DynamicKV
from .full import Full
from .keepkv import KeepKV
from .keydiff import KeyDiff
from .layer_window import LayerWindow
from .morphkv import MorphKV
from .sliding import SlidingWindow
from .snapkv import SnapKV
from .streaming import Streaming

#: Policy name → class, for ``make_policy``, ``headprobe generate --policy`` and eval settings.
#: :class:`SlidingWindow` is not listed: it serves sliding-window layers whatever the policy.
POLICIES: dict[str, type[Policy]] = {cls.name: cls for cls in (Full, SnapKV, Streaming, KeyDiff, MorphKV,
                                                                 KeepKV, DynamicKV, LayerWindow)}

__all__ = ["POLICIES", "DynamicKV", "Full", "KeepKV", "KeyDiff", "LayerContext", "LayerWindow", "MorphKV", "Policy",
           "Rebalance", "ScorerPolicy", "SlidingWindow", "SnapKV", "Streaming"]
