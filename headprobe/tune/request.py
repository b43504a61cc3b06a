"""What a tune is asked: its task (eval items over a length × depth grid, a dataset's examples, or RULER's
generated samples) and its request (capacities, search space, split, race rule, presets), both made before
the model loads (:func:`~headprobe.tune.runner.run_tune` runs them).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import HeadprobeError
from ..eval.babi import generate_questions
from ..eval.items import items_from_babi, items_from_needles
from ..eval.presets import EVAL_PRESETS
from ..eval.ruler_data import load_ruler_dir
from ..eval.ruler_generate import generate_ruler
from ..eval.ruler_task import RulerTask
from ..eval.settings import SettingSpec, parse_settings, parse_spec
from ..haystack.needles import load_needles, needle_set_record
from ..probes.log_settings import portable_file_name
from .halving import HalvingRule
from .space import SearchSpace
from .split import Split


@dataclass
class TuneTask:
    """What the candidates are asked: eval items over a length × depth grid, or dataset examples.

    Attributes
    ----------
    kind
        ``needle``, ``babi``, ``dataset`` or ``ruler``.
    items
        :class:`~headprobe.eval.items.EvalItem` of a grid task (``None`` for a dataset).
    examples
        :class:`~headprobe.eval.datasets.QAExample` of a dataset (``None`` for a grid).
    lengths, depths
        The grid (a dataset: ``[max_length]`` and ``[None]``).
    haystack
        The haystack of a grid task.
    description
        The eval result's ``task`` block.
    answer_task
        How a dataset's examples are prompted and scored (``None``: LongBench QA;
        :class:`~headprobe.eval.ruler_task.RulerTask` for RULER).
    generation
        RULER: the calibration and held-out :class:`~headprobe.eval.ruler_generate.RulerGeneration`, whose
        samples :meth:`generate` makes once the tokenizer is loaded (``examples`` is ``None`` until then).
    """

    kind: str
    lengths: list[int]
    depths: list[float | None]
    description: dict[str, Any]
    items: list[Any] | None = None
    examples: list[Any] | None = None
    haystack: Any = None
    answer_task: Any = None
    generation: tuple[Any, Any] | None = None

    @classmethod
    def needles(cls, path: str | Path, ids: Sequence[str] | None, lengths: Sequence[int], depths: Sequence[float],
                haystack: Any) -> TuneTask:
        """The needle task: the needles of ``path`` (``ids`` of them, or all) over a length × depth grid.

        The description names the needle file portably (a shipped file by its place among the shipped
        haystacks, with its fingerprint), so a run resumes from its logs wherever the files lie.
        """
        needles = load_needles(path, list(ids) if ids else None)
        description = {"kind": "needle", "needles": needle_set_record([Path(path)], needles, portable_file_name),
                       **_haystack_record(haystack)}
        return cls("needle", list(lengths), list(depths), description, items=items_from_needles(needles),
                   haystack=haystack)

    @classmethod
    def babi(cls, count: int, tasks: Sequence[str], seed: int, lengths: Sequence[int], depths: Sequence[float],
             haystack: Any) -> TuneTask:
        """bAbI-style questions (:func:`~headprobe.eval.babi.generate_questions`) over a length × depth grid."""
        items = items_from_babi(generate_questions(count, list(tasks), seed))
        description = {"kind": "babi", "count": count, "tasks": list(tasks), "seed": seed,
                       **_haystack_record(haystack)}
        return cls("babi", list(lengths), list(depths), description, items=items, haystack=haystack)

    @classmethod
    def dataset(cls, examples: Sequence[Any], name: str, max_length: int) -> TuneTask:
        """Rows of a QA dataset (:func:`~headprobe.eval.datasets.load_qa_dataset`), each prompt cut to ``max_length``."""
        return cls("dataset", [max_length], [None], {"dataset": name}, examples=list(examples))

    @classmethod
    def ruler(cls, calibration: Any, holdout: Any, max_new_tokens: int | None = None) -> TuneTask:
        """RULER's samples made by its own generator for the model's tokenizer: the calibration items from
        ``calibration``, the held-out ones from ``holdout`` (two
        :class:`~headprobe.eval.ruler_generate.RulerGeneration` that differ in their seed), so the held-out
        report is on samples the search never saw. Item ids are ``s<seed>/TASK/LENGTH/INDEX``."""
        if calibration.seed == holdout.seed:
            raise HeadprobeError(f"RULER tune: the held-out samples need another seed than the calibration's "
                                 f"({calibration.seed})")
        record = {"generated": calibration.to_json(), "holdout_generated": holdout.to_json()}
        return cls("ruler", [0], [None], {"dataset": "ruler", **record}, answer_task=RulerTask(record, max_new_tokens),
                   generation=(calibration, holdout))

    @staticmethod
    def ruler_ids(request: Any) -> list[str]:
        """The item ids of the samples ``request`` makes (``s<seed>/TASK/LENGTH/INDEX``)."""
        return [f"s{request.seed}/{t}/{L}/{i}" for L in request.lengths for t in request.tasks
                for i in range(request.samples)]

    def generate(self, tokenizer: Any, max_context: int | None) -> None:
        """Make a RULER task's samples for ``tokenizer`` (nothing for other tasks); ``max_context`` (the
        model's context) becomes the prompt bound.

        Raises
        ------
        HeadprobeError
            The generator failing, or samples other than the ids announced (:meth:`ruler_ids`).
        """
        if self.generation is None or self.examples is not None:
            return

        examples = []
        for request in self.generation:
            with tempfile.TemporaryDirectory(prefix="headprobe-ruler-") as folder:
                generate_ruler(request, tokenizer, folder)
                examples += [replace(ex, id=f"s{request.seed}/{ex.id}")
                             for ex in load_ruler_dir(folder, list(request.tasks))]
        wanted = [i for r in self.generation for i in self.ruler_ids(r)]
        if sorted(ex.id for ex in examples) != sorted(wanted):
            raise HeadprobeError(f"RULER's generator made {len(examples)} samples, not the {len(wanted)} announced")
        self.examples = examples
        self.lengths = [max_context or 2**31 - 1]

    @property
    def ids(self) -> list[str]:
        if self.generation is not None and self.examples is None:
            return [i for r in self.generation for i in self.ruler_ids(r)]
        return [i.id for i in (self.items if self.items is not None else self.examples)]

    def subset(self, ids: Sequence[str]) -> list[Any]:
        chosen = set(ids)
        return [i for i in (self.items if self.items is not None else self.examples) if i.id in chosen]

    def trial_keys(self, ids: Sequence[str]) -> list[tuple[str, int, float | None]]:
        """``(item, length, depth)`` of every trial of ``ids``, sorted (the order the bootstrap reads them in)."""
        return sorted(((i, L, d) for i in ids for L in self.lengths for d in self.depths),
                      key=lambda k: (k[0], k[1], -1.0 if k[2] is None else k[2]))


def _haystack_record(haystack: Any) -> dict[str, Any]:
    return {"haystack": haystack.name, "haystack_fingerprint": haystack.fingerprint}


@dataclass
class TuneRequest:
    """What to tune.

    Attributes
    ----------
    capacities
        Mean tokens per KV head to tune for.
    space
        The search space.
    split
        Calibration and held-out items.
    task
        The task.
    rule
        How races drop candidates.
    presets
        Settings evaluated on the held-out items beside the chosen settings (default: every preset), parsed
        once (:func:`~headprobe.eval.settings.parse_settings`); settings as written are parsed as the request
        is made.
    max_new_tokens, chat_template, share_prefill, profile_dirs
        As in :class:`~headprobe.eval.runner.EvalRequest`.
    memory
        The memory target the capacity came from (:func:`~headprobe.tune.memory.capacity_for`), if any.
    """

    capacities: list[int]
    space: SearchSpace
    split: Split
    task: TuneTask
    rule: HalvingRule = field(default_factory=HalvingRule)
    presets: list[SettingSpec] = field(default_factory=lambda: parse_settings(list(EVAL_PRESETS)))
    max_new_tokens: int = 24
    chat_template: bool = True
    share_prefill: bool = True
    profile_dirs: list[Path] | None = None
    memory: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.presets = [p if isinstance(p, SettingSpec) else parse_spec(p) for p in self.presets]


__all__ = ("TuneRequest", "TuneTask")
