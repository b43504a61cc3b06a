"""The ranks of a ``torchrun`` launch: who this process is, its device, its process group, gathering at rank 0.

``torchrun`` starts one process per rank and tells each who it is through the environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``); :func:`process_group` reads it and
joins the group (gloo on the CPU, nccl on CUDA, each rank on GPU ``LOCAL_RANK``). Without ``torchrun``
the environment names no ranks and everything runs as one process.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from ..errors import HeadprobeError, param

#: How long a collective waits for the slowest rank (the final gather waits for every rank's share of work).
DEFAULT_TIMEOUT = datetime.timedelta(hours=12)

T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    """This process's place in a launch.

    Attributes
    ----------
    rank, world_size
        Global rank and number of ranks (``0`` and ``1`` without ``torchrun``).
    local_rank
        Rank on this machine; the GPU a rank uses.
    backend
        The process group's backend (``"gloo"``, ``"nccl"``), ``None`` for one process.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that gathers and writes the merged outputs."""
        return self.rank == 0

    @property
    def shard(self) -> tuple[int, int] | None:
        """``(rank, world_size)`` under ``torchrun`` with several ranks, else ``None``."""
        return (self.rank, self.world_size) if self.distributed else None

    @property
    def tag(self) -> str:
        """``"shard{rank}of{world_size}"``: what this rank's own files carry in their names."""
        return f"shard{self.rank}of{self.world_size}"

    def mine(self, items: Sequence[T]) -> list[T]:
        """This rank's share of ``items``: every ``world_size``-th one from position ``rank``."""
        return list(items[self.rank::self.world_size])

    def owns(self, index: int) -> bool:
        """Whether item ``index`` of a list dealt by :meth:`mine` is this rank's."""
        return index % self.world_size == self.rank

    def part_path(self, path: str | Path) -> Path:
        """``dir/stem.shard{i}of{n}.suffix``: this rank's own file beside the merged ``path`` (``path`` itself
        for one process)."""
        path = Path(path)
        return path.with_name(f"{path.stem}.{self.tag}{path.suffix}") if self.distributed else path

    def check_shard(self, shard: tuple[int, int] | None) -> None:
        """Refuse a shard given by hand under ``torchrun``: the ranks already split the work.

        Raises
        ------
        HeadprobeError
            ``shard`` set with several ranks.
        """
        if shard is not None and self.distributed:
            raise HeadprobeError(f"{param('shard', '/'.join(map(str, shard)))}: the {self.world_size} torchrun ranks "
                                 "already split the grid; leave it unset")

    def device(self, asked: str | None) -> str | None:
        """The device this rank loads its model on.

        Unset or ``"cuda"`` gives GPU ``LOCAL_RANK`` when there are GPUs (unset: else the CPU); an explicit
        device is kept. ``"auto"`` spreads a model over every GPU it sees, so it is refused on a GPU
        machine with several ranks (every rank would fill the same GPUs).

        Raises
        ------
        HeadprobeError
            ``"auto"`` with several ranks and GPUs, or fewer GPUs than ranks on this machine.
        """
        if not self.distributed:
            return asked
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if asked == "auto" and gpus:
            raise HeadprobeError(f"{param('device', 'auto')} spreads the model over all {gpus} GPUs, which "
                                 f"{self.world_size} ranks would share; run one rank per model copy, or leave "
                                 f"{param('device')} unset for one GPU per rank")
        if asked in (None, "cuda") and gpus:
            if self.local_rank >= gpus:
                raise HeadprobeError(f"local rank {self.local_rank}: this machine has {gpus} GPUs; start at "
                                     f"most {gpus} processes per node")
            return f"cuda:{self.local_rank}"
        return asked

    @contextlib.contextmanager
    def local_main_first(self) -> Iterator[None]:
        """Inside the block, local rank 0 of each machine goes first and the others wait for it: loading a
        model converts and caches its files once per machine instead of racing."""
        if not self.distributed:
            yield
            return
        if self.local_rank != 0:
            _barrier()
        try:
            yield
        finally:
            if self.local_rank == 0:
                _barrier()

    def gather_json(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` (JSON-serialisable), in rank order, at rank 0; ``None`` on the others.

        A collective: every rank calls it, and it returns once all have (rank 0 waits for the slowest).
        The objects travel as JSON text.
        """
        text = json.dumps(obj, ensure_ascii=False, allow_nan=False)
        if not self.distributed:
            return [json.loads(text)]

        texts: list[str] | None = [""] * self.world_size if self.is_main else None
        dist.gather_object(text, texts, dst=0)
        return [json.loads(t) for t in texts] if texts is not None else None


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise HeadprobeError(f"environment variable {name}={value!r}: expected an integer (torchrun sets it)") from None


def ranks_from_env(env: Mapping[str, str] | None = None) -> Ranks:
    """The ranks ``torchrun`` describes in the environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``); one
    process when they are unset.

    Raises
    ------
    HeadprobeError
        Values that are not integers or a rank outside ``0 .. WORLD_SIZE-1``.
    """
    env = os.environ if env is None else env
    world = _env_int(env, "WORLD_SIZE", 1)
    rank = _env_int(env, "RANK", 0)
    local = _env_int(env, "LOCAL_RANK", rank)
    if world < 1 or not 0 <= rank < world or local < 0:
        raise HeadprobeError(f"environment: RANK={rank}, LOCAL_RANK={local}, WORLD_SIZE={world}; expected "
                             "0 <= RANK < WORLD_SIZE (start the ranks with torchrun)")
    return Ranks(rank, world, local)


def backend_for(device: str | None) -> str:
    """``"nccl"`` when the ranks compute on CUDA, else ``"gloo"``."""
    on_cuda = torch.cuda.is_available() and (device is None or str(device).startswith("cuda"))
    return "nccl" if on_cuda else "gloo"


@contextlib.contextmanager
def process_group(device: str | None = None, timeout: datetime.timedelta = DEFAULT_TIMEOUT,
                  env: Mapping[str, str] | None = None) -> Iterator[Ranks]:
    """Join the ``torchrun`` process group for the block (one process: nothing to join).

    Parameters
    ----------
    device
        The device asked for (``None``, ``"cpu"``, ``"cuda"``, ...): CUDA ranks use nccl, CPU ranks gloo;
        with nccl each rank's current GPU is ``LOCAL_RANK``.
    timeout
        How long a collective waits for the slowest rank.
    env
        The environment to read the ranks from (default: ``os.environ``).

    Yields
    ------
    Ranks
        This process's ranks, with the backend in use.
    """
    ranks = ranks_from_env(env)
    if not ranks.distributed:
        yield ranks
        return

    if dist.is_initialized():          # a caller that joined the group itself keeps it
        yield Ranks(ranks.rank, ranks.world_size, ranks.local_rank, dist.get_backend())
        return
    backend = backend_for(device)
    if backend == "nccl":
        torch.cuda.set_device(ranks.local_rank % torch.cuda.device_count())
    dist.init_process_group(backend=backend, timeout=timeout)
    finished = False
    try:
        yield Ranks(ranks.rank, ranks.world_size, ranks.local_rank, backend)
        finished = True
    finally:
        if finished:        # leave together: rank 0's outputs are written before any rank tears down its group
            _barrier()
        dist.destroy_process_group()


def _barrier() -> None:
    """Wait for every rank of the default group (on nccl, at this rank's current GPU)."""
    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()
