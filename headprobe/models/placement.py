"""Where a model's weights live and where its inputs go: one device, or layers spread by accelerate.

``device="auto"`` hands placement to accelerate (``device_map="auto"``): layers fill the GPUs, then the
CPU, then the disk, each as far as ``max_memory`` allows. An explicit ``device_map`` (module name →
``"cpu"``, ``"disk"``, a GPU index or ``"cuda:N"``) places them by hand. Layers on ``"disk"`` stay on disk
(read from the checkpoint's safetensors files, or from ``offload_folder`` for other checkpoints) and
accelerate's hooks load them for each forward; layers on ``"cpu"`` next to GPU layers are moved to the
GPU by the same hooks. The recorder and the compressed cache follow the tensors they are handed, so they
work on every layer's own device.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import HeadprobeError, param

if TYPE_CHECKING:
    from transformers import PreTrainedModel

#: The places a ``max_memory`` key or a ``device_map`` value may name besides a GPU index.
HOST_PLACES = ("cpu", "disk")


def _place(value: Any, what: str) -> int | str:
    """A device as accelerate names it: a GPU index (``0``), ``"cpu"`` or ``"disk"``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    text = str(value).strip().lower()
    if text in HOST_PLACES:
        return text
    if text.startswith("cuda:"):
        text = text.removeprefix("cuda:")
    if text.isdigit():
        return int(text)
    raise HeadprobeError(f"{what}: {value!r} is not a device; expected cpu, disk, a GPU index or cuda:N")


def check_max_memory(max_memory: Mapping[Any, Any]) -> dict[int | str, int]:
    """``max_memory`` with accelerate's device keys and sizes in bytes.

    Parameters
    ----------
    max_memory
        Device (``0``, ``"cuda:1"``, ``"cpu"``, ``"disk"``) → size (bytes, or a string such as ``"20GiB"``,
        ``"300MB"``).

    Raises
    ------
    HeadprobeError
        A key that is not a device or a size accelerate cannot read.
    """
    # accelerate loads only when --max-memory is given
    from accelerate.utils import convert_file_size_to_int

    out: dict[int | str, int] = {}
    for key, size in max_memory.items():
        place = _place(key, param("max_memory", f"{key}={size}"))
        try:
            out[place] = int(size) if str(size).strip().isdigit() else convert_file_size_to_int(size)
        except (ValueError, TypeError):
            raise HeadprobeError(f"{param('max_memory', f'{key}={size}')}: expected a size such as 20GiB or "
                                 "300MB") from None
        if out[place] < 0:
            raise HeadprobeError(f"{param('max_memory', f'{key}={size}')}: expected a size of 0 or more")
    return out


def parse_max_memory(items: Iterable[str]) -> dict[int | str, int]:
    """``["0=20GiB", "cpu=64GiB"]`` → ``{0: 21474836480, "cpu": 68719476736}`` (:func:`check_max_memory`).

    Raises
    ------
    HeadprobeError
        An item without ``=``, or one :func:`check_max_memory` refuses.
    """
    pairs = {}
    for item in items:
        key, sep, size = item.partition("=")
        if not sep or not key or not size:
            raise HeadprobeError(f"{param('max_memory', item)}: expected DEVICE=SIZE, e.g. 0=20GiB or cpu=300MB")
        pairs[key] = size
    return check_max_memory(pairs)


def placement_kwargs(device: str, max_memory: Mapping[Any, Any] | None = None,
                     offload_folder: str | Path | None = None,
                     device_map: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``from_pretrained`` arguments that place the weights.

    Parameters
    ----------
    device
        ``"auto"`` (accelerate places the layers) or one device (``"cpu"``, ``"cuda:0"``).
    max_memory
        Per-device limits for ``"auto"`` (:func:`check_max_memory`).
    offload_folder
        Where accelerate keeps the layers placed on ``"disk"`` (layers stored as safetensors are read from
        the checkpoint itself and need none).
    device_map
        An explicit map, module name → device (``device`` must be ``"auto"``).

    Raises
    ------
    HeadprobeError
        ``max_memory``, ``offload_folder`` or ``device_map`` with a single device; an empty ``device_map``
        or one that names no device.
    """
    if device != "auto":
        for name, value in (("max_memory", max_memory), ("offload_folder", offload_folder),
                            ("device_map", device_map)):
            if value is not None:
                raise HeadprobeError(f"{param(name)} spreads the model over devices; it needs "
                                     f"{param('device', 'auto')}, not {param('device', device)}")
        return {"device_map": {"": device}}
    kwargs: dict[str, Any] = {}
    if device_map is not None:
        if not device_map:
            raise HeadprobeError(f"{param('device_map')}: empty; expected module name → device")
        kwargs["device_map"] = {str(k): _place(v, f"{param('device_map')} {k}") for k, v in device_map.items()}
    else:
        kwargs["device_map"] = "auto"
    if max_memory is not None:
        kwargs["max_memory"] = check_max_memory(max_memory)
    if offload_folder is not None:
        folder = Path(offload_folder).expanduser()
        if folder.exists() and not folder.is_dir():
            raise HeadprobeError(f"{param('offload_folder', str(offload_folder))}: not a directory")
        folder.mkdir(parents=True, exist_ok=True)
        kwargs["offload_folder"] = str(folder)
    return kwargs


def _as_device(value: Any) -> Any:
    # torch loads with a model: --device and --max-memory are checked without it
    import torch

    if isinstance(value, int):
        return torch.device("cuda", value)
    return torch.device(value)


def input_device(model: PreTrainedModel) -> Any:
    """The device a model's input ids go to: its input embedding's execution device.

    A model spread by accelerate has parameters on several devices, and those of layers kept on disk (or
    on the CPU next to GPU layers) sit on ``"meta"`` until their hook loads them; the embedding's hook
    names where its forward runs.
    """
    # torch loads with a model: --device and --max-memory are checked without it
    import torch

    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    hook = getattr(embeddings, "_hf_hook", None)
    execution = getattr(hook, "execution_device", None)
    if execution is not None:
        return _as_device(execution)
    weight = getattr(embeddings, "weight", None)
    if weight is not None and weight.device.type != "meta":
        return weight.device
    for parameter in model.parameters():
        if parameter.device.type != "meta":
            return parameter.device
    return torch.device("cpu")

