"""KV-cache budget allocation: turn profiles into per (layer, KV head) token budgets.

Allocators (one module each, each defining its options dataclass and its ``ALLOCATOR``): :mod:`.headkv`
(HeadKV, with ``compat="headkv"``), :mod:`.dynamickv_offline`, :mod:`.combined` (DynamicKV layer budgets
split by head scores), :mod:`.uniform` (SnapKV), :mod:`.pyramid` (PyramidKV); :data:`ALLOCATORS` names them
with what each reads and its options, and :func:`allocate` runs one by name. The integer arithmetic they share
with the runtime (exact splits, clamping to a prompt) is :mod:`headprobe.budget_arithmetic`.
"""
