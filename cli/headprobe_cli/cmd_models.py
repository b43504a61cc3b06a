"""``headprobe models``: list the model aliases."""

from __future__ import annotations

import argparse
import importlib.util

from headprobe.models.registry import DEFAULT_MODEL, MODELS


def register(p: argparse.ArgumentParser) -> None:
    """Fill the parser ``main`` made for this command (its name and one-line help are ``main.COMMANDS``)."""
    p.description = "List the model aliases --model accepts."
    p.epilog = "example:\n  headprobe models\n\nAny Hugging Face id or local directory works too."
    p.set_defaults(func=run)


def run(args) -> int:  # noqa: ARG001 (every command's run(args))
    width = max(len(a) for a in MODELS)
    idw = max(len(s.hf_id) for s in MODELS.values())
    for alias, spec in MODELS.items():
        if spec.gguf_package:
            where = "installed" if importlib.util.find_spec(spec.gguf_package) else f"needs: {spec.pip_install}"
        else:
            where = "from_pretrained"
        default = " (default)" if alias == DEFAULT_MODEL else ""
        print(f"{alias:<{width}}  {spec.hf_id:<{idw}}  {where}{default}")
        if spec.note:
            print(f"{'':<{width}}  {spec.note}")
    return 0
