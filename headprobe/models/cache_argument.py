"""The keyword under which the installed transformers takes a KV cache.

transformers 5.24 renamed the cache argument of every model's, decoder layer's and attention's ``forward``
(and of ``generate``) from ``past_key_values`` to ``cache``, and warns (``FutureWarning``) when the old name
is passed. Releases before 5.24 know only ``past_key_values``. headprobe passes a cache under the name the
receiving module's own ``forward`` declares, so that every 5.x release the pin admits gets the name it
expects and none of them warns.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from ..errors import HeadprobeError

#: The names transformers has used for a forward's KV-cache argument, newest first.
CACHE_ARGUMENT_NAMES = ("cache", "past_key_values")


@functools.cache
def _declared_name(forward_owner: type) -> str | None:
    params = inspect.signature(forward_owner.forward).parameters      # follows __wrapped__ (deprecate_kwarg)
    return next((name for name in CACHE_ARGUMENT_NAMES if name in params), None)


def cache_argument(module: Any) -> str:
    """``"cache"`` or ``"past_key_values"``: the name ``module.forward`` takes its KV cache under.

    Parameters
    ----------
    module
        A transformers model (``...ForCausalLM`` or its base model) or one of its decoder layers.

    Raises
    ------
    HeadprobeError
        When the module's ``forward`` declares neither name.
    """
    name = _declared_name(type(module))
    if name is None:
        raise HeadprobeError(f"{type(module).__name__}.forward takes no KV cache (neither "
                             f"{' nor '.join(CACHE_ARGUMENT_NAMES)}); headprobe needs a model that does")
    return name


def with_cache(module: Any, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` for ``module(**..., **with_cache(module, cache))`` and ``generate`` alike."""
    return {cache_argument(module): cache}
