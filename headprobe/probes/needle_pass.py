"""The needle passes: needles of one kind inserted into a haystack, at every length, depth and seed of a grid.

The retrieval pass (retrieval needles) records the copy score and the attention-weight score of each
head, profiled as ``retrieval`` and ``enhanced_retrieval``; the reasoning pass (two-fact needles with a
distractor) records the attention-weight score, profiled as ``retrieval_reasoning``, and counts trials
under the request's gate. Both run in every mode (:mod:`headprobe.probes.needle_probe`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import FileFormatError, HeadprobeError, NoPassingTrialsError, param
from ..haystack.context import build_context
from ..haystack.corpus import Haystack
from ..haystack.needles import Needle, needle_set_record
from ..models.identity import ModelIdentity
from .aggregate import (
    COUNT,
    NUMBER,
    OBJECT,
    SECONDS,
    SHARE,
    SWITCH,
    TEXT,
    FieldRule,
    check_fields,
    gate_name,
    is_count,
    needle_profile,
    require_field,
    require_numbers,
)
from .early_stop import run_until_stable
from .gates import choose_gate
from .log_settings import portable_file_name, shard_setting
from .modes import MODES
from .needle_probe import run_fast_trials, run_reference_trials, run_reuse_trials
from .pass_steps import PassSteps, TrialGap
from .probe_config import NeedleProbeConfig, NeedleScores
from .prompt_cache import HaystackCaches
from .selective_prefill import check_reuse_model
from .trial_grid import TrialSpec, make_grid, shard_trials
from .trial_order import spread_order

if TYPE_CHECKING:
    from ..files.trial_log import TrialLog
    from ..models.loading import LoadedModel
    from ..profile import Profile
    from .inputs import RunInputs
    from .pass_steps import PassPlan, PassRun, RunContext
    from .request import ProfileRequest
    from .trial_grid import Grid


@dataclass(frozen=True)
class NeedleInput:
    """What a needle pass reads: its needles, the files they came from, and the haystack."""

    files: tuple[Any, ...]
    needles: tuple[Needle, ...]
    haystack: Haystack


#: The optional request parameters every needle pass reads (the reasoning pass also reads ``gate``).
NEEDLE_PARAMETERS = frozenset({"lengths", "depths", "seeds", "grid", "needle_ids", "haystack", "group_reduction",
                               "batch_size", "split_attention", "recompute_share", "until_stable"})


class NeedlePass(PassSteps):
    """A pass over the needles of one kind.

    Parameters
    ----------
    needle_kind
        The needles it reads (``"retrieval"`` or ``"reasoning"``).
    scores
        The head scores its trials record, by profile kind.
    takes_gate
        Whether its trials count under the request's gate (else the published one).
    """

    runners: ClassVar[Mapping[str, Any]] = {"fast": run_fast_trials, "reference": run_reference_trials,
                                            "reuse": run_reuse_trials}

    def __init__(self, needle_kind: str, scores: NeedleScores, takes_gate: bool = False) -> None:
        self.needle_kind = needle_kind
        self.scores = scores
        self.kinds = scores.names
        self.takes_gate = takes_gate
        self.reads = NEEDLE_PARAMETERS | ({"gate"} if takes_gate else set())

    # ---- before the model loads --------------------------------------------------------------------

    def read(self, request: ProfileRequest, options: Any, inputs: RunInputs) -> NeedleInput:  # noqa: ARG002 (the probe-pass interface)
        """The needles of this kind (the request's files that hold some, else the shipped set), restricted to
        ``needle_ids``, and the haystack."""
        if request.lengths == () or request.depths == () or not request.seeds:
            raise HeadprobeError(f"{param('lengths')}, {param('depths')} and {param('seeds')}: give at least one "
                                 "of each")
        files, needles = inputs.needle_files().of_kind(self.needle_kind, request.needle_ids)
        return NeedleInput(tuple(files), tuple(needles), inputs.haystack())

    # ---- on the model ------------------------------------------------------------------------------

    def settings(self, lm: LoadedModel, plan: PassPlan, context: RunContext) -> dict[str, Any]:
        """Check every prompt against the model; the log's settings. Each needle file is named portably
        (:func:`~headprobe.probes.log_settings.portable_file_name`) beside its fingerprint, as is a user's
        haystack."""
        request, grid, data = context.request, context.grid, plan.data
        if request.mode == "reuse":
            check_reuse_model(lm.model)
        check_grid(lm, grid, request.chat_template, self.needle_kind, list(data.needles), data.haystack)
        gate = choose_gate(request.gate, lm) if self.takes_gate else None
        haystack = data.haystack
        haystack_name = haystack.name if request.haystack is None else portable_file_name(request.haystack)[0]
        return {**context.common, "pass": plan.probe_pass.name, "probes": list(plan.probes),
                "lengths": list(grid.lengths), "depths": rounded_depths(grid), "seeds": list(request.seeds),
                "needle_set": needle_set_record(list(data.files), list(data.needles), portable_file_name),
                "haystack": {"name": haystack_name, "fingerprint": haystack.fingerprint},
                "gate": gate.gate if gate is not None else "published", **(gate.settings() if gate is not None else {}),
                "max_new_tokens": request.max_new_tokens, "shard": shard_setting(request.shard),
                **_approximation(request)}

    def trials(self, run: PassRun) -> list[TrialSpec]:
        grid = run.context.grid
        return shard_trials(make_grid([n.id for n in run.plan.data.needles], list(grid.lengths), rounded_depths(grid),
                                      list(run.request.seeds)), run.request.shard)

    def progress_label(self, run: PassRun) -> str:
        return f"{'+'.join(run.settings['probes'])} ({run.request.mode})"

    def run(self, lm: LoadedModel, run: PassRun, todo: list[TrialSpec], log: TrialLog, progress: Any) -> Any:
        """Run ``todo`` by the runner of the request's mode, or, with ``until_stable``, the grid in spread order
        until its top heads are stable (returning the outcome)."""
        request, settings, data = run.request, run.settings, run.plan.data
        config = NeedleProbeConfig(scores=self.scores, mode=request.mode, chat_template=request.chat_template,
                                   batch_size=request.batch_size, max_new_tokens=request.max_new_tokens,
                                   gate=settings["gate"], split_attention=request.split_attention,
                                   recompute_share=request.recompute_share)
        haystacks = {s: haystack_for_seed(data.haystack, s) for s in request.seeds}
        by_id = {n.id: n for n in data.needles}
        runner = self.runner(request.mode)
        if request.until_stable is None:
            runner(lm, haystacks, by_id, todo, config, log.append, progress)
            return None

        caches = HaystackCaches(keep=len(run.context.grid.lengths) * len(request.seeds))
        rule = request.until_stable
        gates = {kind: gate_name(kind, settings) for kind in self.score_kinds(settings)}
        return run_until_stable(
            spread_order(self.trials(run), rule.order_seed), log.done,
            lambda chunk: runner(lm, haystacks, by_id, chunk, config, log.append, progress, caches),
            gates, rule)

    # ---- logs into profiles ------------------------------------------------------------------------

    def profiles(self, settings: dict[str, Any], records: list[dict[str, Any]]) -> list[Profile]:
        """One profile per score kind of the log; a kind no trial passed is left out (all left out: raised)."""
        identity = ModelIdentity.from_json(settings["model"], "<trial log>")
        reduction = settings.get("group_reduction", "mean")
        profiles, failures = [], []
        for kind in self.score_kinds(settings):
            try:
                profiles.append(needle_profile(kind, identity, settings, records, reduction))
            except NoPassingTrialsError as exc:
                failures.append(str(exc))
        if failures and not profiles:
            raise NoPassingTrialsError("; ".join(failures))
        return profiles

    def check_records(self, settings: dict[str, Any], records: list[tuple[str, dict[str, Any]]]) -> None:
        """A record needs its id, needle, length, depth and seed (the id must be the one they make), a boolean
        for the gate its scores are counted under, and for each score kind of the log a
        ``[layers][query_heads]`` matrix of non-negative numbers no larger than the probe can produce
        (:func:`score_bound`); every other field it holds must be of its type (:data:`RECORD_FIELDS`,
        :data:`GATE_FIELDS`: ``passed`` a boolean, ``seconds`` a finite number >= 0, ...)."""
        identity = ModelIdentity.from_json(settings["model"], "<trial log>")
        layers, heads = identity.num_layers, identity.num_query_heads
        kinds = self.score_kinds(settings)
        gates = sorted({gate_name(k, settings) for k in kinds})
        for where, r in records:
            for key, kind in (("needle", str), ("length", int), ("depth", (int, float)), ("seed", int),
                              ("gates", dict), ("scores", dict)):
                require_field(r, key, kind, where)
            check_fields(r, RECORD_FIELDS, where)
            check_fields(r["gates"], GATE_FIELDS, where, "gates.")
            expected = TrialSpec(r["length"], r["seed"], r["depth"], r["needle"]).id
            if r["trial"] != expected:
                raise FileFormatError(where, "trial", f"expected {expected!r} (from its needle, length, depth and "
                                      f"seed), found {r['trial']!r}")
            for gate in gates:
                if not isinstance(r["gates"].get(gate), bool):
                    raise FileFormatError(where, f"gates.{gate}", f"expected true or false, found {r['gates'].get(gate)!r}")
            most = score_bound(r["length"], settings, identity)
            for kind in kinds:
                require_numbers(r["scores"].get(kind), [layers, heads], where, f"scores.{kind}", most)

    def missing_trials(self, settings: dict[str, Any], found: dict[str, str], shards: list[list[int]]) -> TrialGap:
        """The trials of the grid the settings describe (needles × lengths × depths × seeds) no log holds."""
        grid = make_grid(list(settings["needle_set"]["ids"]), list(settings["lengths"]), list(settings["depths"]),
                         list(settings["seeds"]))
        ids = {t.id for t in grid}
        for trial, where in found.items():
            if trial not in ids:
                raise FileFormatError(where, "trial", f"{trial!r} is not in the grid of the log's settings")
        missing = [t.id for t in grid if t.id not in found]
        return TrialGap(len(missing), missing, f"{len(missing)} of {len(grid)} trials of the grid are missing"
                        + _missing_shards(grid, missing, shards))


#: The fields of a needle trial record besides those every record needs, checked where a record holds them.
RECORD_FIELDS: dict[str, FieldRule] = {
    "length": ("a positive integer", lambda v: is_count(v) and v > 0),
    "depth": SHARE,
    "mode": (f"one of {', '.join(MODES)}", lambda v: v in MODES),
    "prompt_tokens": COUNT,
    "answer_span": ("[start, end] with 0 <= start < end",
                    lambda v: isinstance(v, list) and len(v) == 2 and all(is_count(x) for x in v) and v[0] < v[1]),
    "actual_depth": NUMBER,
    "response": TEXT,
    "passed": SWITCH,
    "seconds": SECONDS,
    "recompute_share": SHARE,
    "reuse": OBJECT,
}
#: The gates a needle trial record may hold.
GATE_FIELDS: dict[str, FieldRule] = {
    "rouge1_recall": SHARE, "qa_f1": SHARE, "greedy_is_gold": SWITCH, "likelihood_margin": NUMBER,
    "likelihood": SWITCH, "published": SWITCH,
}


def score_bound(length: int, settings: dict[str, Any], identity: ModelIdentity) -> int:
    """The largest head score a trial of ``length`` tokens can hold.

    A score (copy or attention weight, :mod:`headprobe.probes.head_scores`) adds at most ``1/len(span)``
    per response step, so it is at most the trial's number of response steps: the tokens decoded (at most
    ``max_new_tokens``) or teacher-forced (a part of the needle, which lies inside the prompt), and fewer
    than the model's context. A larger value is not a measurement (a hand-edited or corrupt record) and
    would dominate, or overflow, the mean.
    """
    return max(length + int(settings.get("max_new_tokens") or 0), identity.max_context or 0)


def _missing_shards(grid: list[TrialSpec], missing: list[str], shards: list[list[int]]) -> str:
    """``" (shards 1/4, 3/4 not given; first: r01|len=...)"``: where the missing trials are."""
    if not missing:
        return ""
    counts = {n for _, n in shards}
    parts = []
    if len(counts) == 1:
        n = counts.pop()
        given, lacking = {i for i, _ in shards}, set(missing)
        absent = [f"{i}/{n}" for i in range(n) if i not in given and
                  any(t.id in lacking for t in shard_trials(grid, (i, n)))]
        if absent:
            parts.append(f"shard{'s' if len(absent) > 1 else ''} {', '.join(absent)} not given")
    parts.append(f"first: {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}")
    return f" ({'; '.join(parts)})"


def rounded_depths(grid: Grid) -> list[float]:
    """The grid's depths as logs record them (6 decimals)."""
    return [round(d, 6) for d in grid.depths]


def _approximation(request: ProfileRequest) -> dict[str, Any]:
    """Settings that make a run other than the exact full grid (absent otherwise, so older logs resume)."""
    out: dict[str, Any] = {}
    if request.mode == "reuse":
        out["recompute_share"] = request.recompute_share
    if request.until_stable is not None:
        out["until_stable"] = request.until_stable.to_json()
    return out


def haystack_for_seed(base: Haystack, seed: int) -> Haystack:
    """Seed 0 keeps the corpus order; other seeds shuffle its documents (blank-line separated blocks)."""
    if seed == 0:
        return base
    docs = base.text.split("\n\n")
    random.Random(seed).shuffle(docs)
    return Haystack(f"{base.name}#seed{seed}", "\n\n".join(docs))


def check_grid(lm: LoadedModel, grid: Grid, chat_template: bool, kind: str, needles: list[Needle],
               haystack: Haystack) -> None:
    """Refuse lengths the model's context, the prompt around the haystack or the haystack cannot hold.

    Builds the prompt of every needle at the shortest length (the needle and question must leave room
    for haystack) and of one needle at the longest (the context and the haystack must hold it), with the
    model's tokenizer and chat template, before any trial runs.

    Raises
    ------
    HeadprobeError
        Naming ``lengths`` (and the needle, for a prompt too long for the shortest length).
    """
    max_context = lm.identity.max_context
    for length in grid.lengths:
        if max_context and length > max_context:
            raise HeadprobeError(f"{param('lengths', length)}: beyond the model's context of {max_context} tokens")
    shortest, longest = min(grid.lengths), max(grid.lengths)
    for needle in needles:
        try:
            build_context(lm.tokenizer, haystack, needle, shortest, grid.depths[0], chat_template, max_context)
        except HeadprobeError as exc:
            raise HeadprobeError(f"{exc} ({kind} needle {needle.id})") from None
    build_context(lm.tokenizer, haystack, needles[0], longest, grid.depths[0], chat_template, max_context)


#: The retrieval pass: copy score (``retrieval``) and attention-weight score (``enhanced_retrieval``).
RETRIEVAL = NeedlePass("retrieval", NeedleScores(weight="enhanced_retrieval", copy="retrieval"))
#: The reasoning pass: attention-weight score (``retrieval_reasoning``), counted under the request's gate.
REASONING = NeedlePass("reasoning", NeedleScores(weight="retrieval_reasoning"), takes_gate=True)
