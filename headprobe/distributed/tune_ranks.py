"""What a tune run's ranks share: the merged cells of each eval run, from rank 0 to every rank.

:func:`~headprobe.distributed.eval_ranks.run_eval_on_ranks` merges the ranks' cells at rank 0; a tune's
next step (which candidates go on) is decided from them on every rank, so rank 0 sends the merged cells
to all (the same decisions everywhere, and the same as one process makes).
"""

from __future__ import annotations

import json
from typing import Any

import torch.distributed as dist

from .ranks import Ranks


def share_from_main(ranks: Ranks, obj: Any) -> Any:
    """Rank 0's ``obj`` (JSON-serialisable) on every rank; ``obj`` itself for one process.

    A collective: every rank calls it. The object travels as JSON text, so every rank reads back the
    same values (one process reads its own through JSON too).
    """
    text = json.dumps(obj, ensure_ascii=False, allow_nan=False)
    if ranks.distributed:
        box = [text if ranks.is_main else None]
        dist.broadcast_object_list(box, src=0)
        text = box[0]
    return json.loads(text)


__all__ = ("share_from_main",)
