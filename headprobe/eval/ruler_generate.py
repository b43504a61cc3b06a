"""RULER's data made by RULER's own generator for the loaded model's tokenizer, offline.

The generator is RULER's (``prepare.py`` and the task scripts under ``data/synthetic``), as the
``nvidia-long-context-eval`` package ships it with its data (Paul Graham essays, SQuAD, HotpotQA). Each task
script is run the way ``prepare.py`` runs it (the ``base`` model template, the task's template and answer
prefix, its ``synthetic.yaml`` arguments and tokens to generate) with one difference: the random seed is
``seed`` (``prepare.py`` always passes 42, so ``seed=42`` writes its files byte for byte). The files land as
``FOLDER/LENGTH/TASK/validation.jsonl``, which :func:`headprobe.eval.ruler_data.load_ruler_dir` reads.

The essay-haystack tasks split the essays into sentences with NLTK's ``punkt_tab`` data, which the package
does not ship and NLTK downloads from outside the package registries. The ``llama-index-core`` wheel ships
NLTK's data folder with ``punkt_tab`` in it (``llama_index/core/_static/nltk_cache``): installed with
``--no-deps`` it is a folder of files, never imported, and the task scripts get it through ``NLTK_DATA``.
Without either (NLTK's own folders or that package) the essay tasks are refused.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HeadprobeError
from .ruler_data import TASK_FAMILY

#: The package that holds RULER's generator, and the version it was checked against.
PACKAGE = "nvidia-long-context-eval"
PACKAGE_VERSION = "26.3"
#: Installing what generation needs, without the package's serving stack (nemo-evaluator, API clients).
INSTALL = f"pip install 'headprobe[ruler]' && pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}"
#: Modules the task scripts import (besides numpy, tqdm, transformers): module -> PyPI package.
GENERATOR_IMPORTS = {"nltk": "nltk", "wonderwords": "wonderwords", "tenacity": "tenacity", "yaml": "pyyaml"}
#: Tasks whose haystack is the essays, split into sentences by NLTK's punkt_tab.
ESSAY_TASKS = ("niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multivalue", "niah_multiquery")
#: A PyPI package whose wheel holds NLTK's data folder with punkt_tab, and where in it (checked with 0.14.25).
PUNKT_PACKAGE = "llama-index-core"
PUNKT_PACKAGE_DATA = "llama_index/core/_static/nltk_cache"
PUNKT_INSTALL = f"pip install --no-deps {PUNKT_PACKAGE}==0.14.25"
#: Where NLTK looks for punkt_tab's English tables, below a data folder.
PUNKT_ENGLISH = "tokenizers/punkt_tab/english/"
#: Shortest length generated: below it RULER's fitting loops may never fit a prompt.
MIN_LENGTH = 512
#: The fewest documents RULER's qa.py puts in a prompt (its step, ``incremental``).
QA_FEWEST_DOCUMENTS = 10

#: Seconds one task script may run.
TIMEOUT_S = 900


@dataclass(frozen=True)
class RulerGeneration:
    """What to generate: ``tasks`` at each of ``lengths`` (tokens, answer included), ``samples`` each, ``seed``."""

    tasks: tuple[str, ...]
    lengths: tuple[int, ...]
    samples: int
    seed: int

    def to_json(self) -> dict[str, Any]:
        return {"generator": f"{PACKAGE} {PACKAGE_VERSION}", "tasks": list(self.tasks),
                "lengths": list(self.lengths), "samples": self.samples, "seed": self.seed}


def generator_root() -> Path:
    """The installed ``long_context_eval`` folder.

    Raises
    ------
    HeadprobeError
        The package, or a module its generator imports, is missing (naming the install command).
    """
    spec = importlib.util.find_spec("long_context_eval")
    if spec is None or not spec.submodule_search_locations:
        raise HeadprobeError(f"--task ruler without --dataset generates RULER's data with the '{PACKAGE}' package, "
                             f"which is not installed: {INSTALL}")
    missing = [pkg for mod, pkg in GENERATOR_IMPORTS.items() if importlib.util.find_spec(mod) is None]
    if missing:
        raise HeadprobeError(f"RULER's generator needs {', '.join(missing)} (the 'ruler' extra): {INSTALL}")
    return Path(next(iter(spec.submodule_search_locations)))


def punkt_tab_folder() -> Path | None:
    """The NLTK data folder that :data:`PUNKT_PACKAGE` installs, when it holds punkt_tab's English tables
    (found through the package's file list: nothing is imported)."""
    try:
        folder = Path(importlib.metadata.distribution(PUNKT_PACKAGE).locate_file(PUNKT_PACKAGE_DATA))
    except importlib.metadata.PackageNotFoundError:
        return None
    return folder if (folder / PUNKT_ENGLISH).is_dir() else None


def has_punkt_tab() -> bool:
    """Whether NLTK's ``punkt_tab`` sentence data (English) is here: in NLTK's own folders (``NLTK_DATA``
    included) or in :func:`punkt_tab_folder`."""
    # nltk comes with the optional `ruler` extra
    import nltk

    try:
        nltk.data.find(PUNKT_ENGLISH)
    except LookupError:
        return punkt_tab_folder() is not None
    return True


def script_env() -> dict[str, str]:
    """The task scripts' environment: offline, and :func:`punkt_tab_folder` after NLTK's own folders."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    folder = punkt_tab_folder()
    if folder is not None:
        env["NLTK_DATA"] = os.pathsep.join(p for p in (env.get("NLTK_DATA"), str(folder)) if p)
    return env


def check_ruler_generation(request: RulerGeneration, max_context: int | None) -> Path:
    """Refuse, before any model loads, what cannot be generated here; returns :func:`generator_root`.

    Raises
    ------
    HeadprobeError
        An unknown task, a length below :data:`MIN_LENGTH` or past ``max_context``, a sample count below 1,
        a missing package, or an essay task without NLTK's punkt_tab.
    """
    for t in request.tasks:
        if t not in TASK_FAMILY:
            raise HeadprobeError(f"--ruler-tasks {t}: unknown RULER task; expected one of {', '.join(TASK_FAMILY)}")
    for n in request.lengths:
        if n < MIN_LENGTH:
            raise HeadprobeError(f"--lengths {n}: RULER's generator needs at least {MIN_LENGTH} tokens")
        if max_context and n > max_context:
            raise HeadprobeError(f"--lengths {n}: beyond the model's context of {max_context} tokens")
    if request.samples < 1:
        raise HeadprobeError(f"--samples {request.samples}: expected at least 1")
    root = generator_root()
    essays = [t for t in request.tasks if t in ESSAY_TASKS]
    if essays and not has_punkt_tab():
        raise HeadprobeError(f"--ruler-tasks {' '.join(essays)}: RULER splits the essays with NLTK's 'punkt_tab' "
                             f"data, which NLTK does not find here: {PUNKT_INSTALL} (its wheel holds NLTK's "
                             "punkt_tab), or put it where NLTK finds it (NLTK_DATA), or leave these tasks out")
    return root


def task_command(root: Path, task: str, length: int, samples: int, seed: int, tokenizer_dir: str | Path,
                 save_dir: Path) -> list[str]:
    """The command ``prepare.py`` runs for ``task`` (its template, answer prefix and arguments), with ``seed``."""
    # RULER's generator and its config reader: the optional `ruler` extra
    config, base, template = _task_config(root, task)
    cmd = [sys.executable, str(root / "data" / "synthetic" / f"{config['task']}.py"), "--save_dir", str(save_dir),
           "--save_name", task, "--subset", "validation", "--tokenizer_path", str(tokenizer_dir),
           "--tokenizer_type", "hf", "--max_seq_length", str(length),
           "--tokens_to_generate", str(base["tokens_to_generate"]), "--num_samples", str(samples),
           "--random_seed", str(seed)]
    for key, value in config["args"].items():
        cmd += [f"--{key}", str(value)]
    if config["task"] == "qa":
        cmd += ["--pre_samples", "0"]
    return cmd + ["--template", template]


def _task_config(root: Path, task: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """``synthetic.yaml``'s entry for ``task``, its family's constants and the template prepare.py gives it."""
    # yaml and RULER's own constants come with the optional `ruler` extra and the generator package
    import yaml
    from long_context_eval.data.synthetic.constants import TASKS
    config = yaml.safe_load((root / "synthetic.yaml").read_text())[task]
    base = TASKS[config["task"]]
    return config, base, base["template"] + base.get("answer_prefix", "")     # Templates["base"]: "{task_template}"


def hotpotqa_prompt_tokens(root: Path, tokenizer: Any, template: str, samples: int, seed: int,
                           tokens_to_generate: int) -> list[int]:
    """The fewest tokens RULER's ``qa.py`` can give each of the first ``samples`` HotpotQA samples, answer included.

    ``qa.py`` lowers a sample's documents 10 at a time down to 10, and a HotpotQA question comes with 10 of its
    own (its gold and distractor paragraphs), so its shortest prompt is those 10, in the order its seed
    shuffles them, formatted as ``qa.py`` formats them and counted as it counts (``tokenizer.tokenize``). A
    sample whose shortest prompt is longer than the length asked for never fits, and ``qa.py`` retries it
    forever (its bare ``except`` loops once the documents are down to 10).
    """
    data = json.loads((root / "data" / "synthetic" / "json" / "hotpotqa.json").read_text())
    counts = []
    for d in data[:samples]:
        own = [f"{t}\n{''.join(p)}" for t, p in d["context"]]
        if len(own) < QA_FEWEST_DOCUMENTS:    # qa.py adds random documents: a retry can fit
            counts.append(0)
            continue
        random.Random(seed).shuffle(own)
        context = "\n\n".join(f"Document {i + 1}:\n{doc}" for i, doc in enumerate(own))
        text = template.format(context=context, query=d["question"])
        counts.append(len(tokenizer.tokenize(text)) + tokens_to_generate)
    return counts


def check_hotpotqa_fits(request: RulerGeneration, tokenizer: Any, root: Path) -> None:
    """Refuse a HotpotQA task (``qa_2``) at a length one of its samples cannot fit (:func:`hotpotqa_prompt_tokens`).

    Raises
    ------
    HeadprobeError
        Naming the task, the length, the first sample that does not fit and the length that fits them all.
    """
    for task in request.tasks:
        config, base, template = _task_config(root, task)
        if config["task"] != "qa" or config["args"].get("dataset") != "hotpotqa":
            continue
        counts = hotpotqa_prompt_tokens(root, tokenizer, template, request.samples, request.seed,
                                        base["tokens_to_generate"])
        for length in request.lengths:
            over = [(k, n) for k, n in enumerate(counts) if n > length]
            if over:
                k, n = over[0]
                raise HeadprobeError(
                    f"--ruler-tasks {task} --lengths {length}: sample {k}'s own {QA_FEWEST_DOCUMENTS} HotpotQA "
                    f"documents make a prompt of {n} tokens with the answer, and RULER's qa.py then retries "
                    f"forever; give --lengths {max(counts)} or more for these {request.samples} samples, or leave "
                    f"{task} out")


def tokenizer_folder(tokenizer: Any, scratch: Path) -> Path:
    """The folder the loaded tokenizer was read from, else the tokenizer saved into ``scratch``."""
    name = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    if name.is_dir() and (name / "tokenizer_config.json").exists():
        return name
    tokenizer.save_pretrained(scratch)
    return scratch


def generate_ruler(request: RulerGeneration, tokenizer: Any, folder: str | Path, root: Path | None = None,
                   timeout_s: float = TIMEOUT_S, progress: Callable[[str | None], None] | None = None) -> Path:
    """Write RULER's files for ``tokenizer`` under ``folder`` (``LENGTH/TASK/validation.jsonl``).

    ``progress``, when given, is called with ``"TASK at LENGTH tokens"`` as each task script starts (one
    script can take minutes: RULER's QA scripts tokenize their documents one by one) and with ``None`` once
    the last has finished.

    Raises
    ------
    HeadprobeError
        A task script that fails or runs past ``timeout_s`` seconds (its last line of errors named).
    """
    root = root or generator_root()
    check_hotpotqa_fits(request, tokenizer, root)
    folder = Path(folder)
    env = script_env()
    with tempfile.TemporaryDirectory() as scratch:
        tok_dir = tokenizer_folder(tokenizer, Path(scratch))
        for length in request.lengths:
            for task in request.tasks:
                cmd = task_command(root, task, length, request.samples, request.seed, tok_dir, folder / str(length))
                if progress is not None:
                    progress(f"{task} at {length} tokens")
                _run_script(cmd, task, length, env, timeout_s)
    if progress is not None:
        progress(None)
    return folder


def _run_script(cmd: Sequence[str], task: str, length: int, env: dict[str, str], timeout_s: float) -> None:
    """Run one task script; its failure is one line naming the task, the length and its last error line."""
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise HeadprobeError(f"RULER's generator for {task} at {length} tokens did not finish in {timeout_s:g} s "
                             "(a length too short for the task never fits its prompt)") from None
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        raise HeadprobeError(f"RULER's generator failed for {task} at {length} tokens: "
                             f"{lines[-1] if lines else f'exit {done.returncode}'}")
