"""Success gates: which trials count (ROUGE-1 recall, LongBench QA token-F1, candidate likelihood).

The measures of an answer's words are in :mod:`headprobe.answer_text`; this module holds the gate
threshold and the choice of gate per model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import HeadprobeError, param

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from ..models.loading import LoadedModel

#: A trial counts when its gate value is above this (both published gates).
GATE_THRESHOLD = 0.5

#: The retrieval-reasoning gates a profiling run takes (``gate=``, ``--gate``).
GATES = ("auto", "published", "likelihood")

#: ``gate="auto"`` uses the likelihood gate for models with fewer parameters than this, the published gate
#: from this size on. Small models name the right person but rarely restate the activity, so the published
#: QA-F1 gate passes few of their trials (SmolLM2-135M: 12 of 96 on the CPU grid) and their profile
#: averages over too few trials; larger instruction-tuned models answer in words the F1 gate counts.
AUTO_LIKELIHOOD_BELOW = 1_000_000_000


@dataclass(frozen=True)
class GateChoice:
    """The retrieval-reasoning gate of a run and why.

    Attributes
    ----------
    gate
        ``"published"`` or ``"likelihood"``.
    requested
        What the caller asked for: one of :data:`GATES`.
    parameters
        The model's parameter count (what ``"auto"`` decides by).
    """

    gate: str
    requested: str
    parameters: int

    def describe(self) -> str:
        """One line for the command's output, e.g. ``likelihood (auto: 0.13B parameters, below 1B)``."""
        if self.requested != "auto":
            return f"{self.gate} (as requested)"
        size = f"{self.parameters / 1e9:.2g}B parameters"
        limit = f"{AUTO_LIKELIHOOD_BELOW / 1e9:g}B"
        return f"{self.gate} (auto: {size}, {'below' if self.gate == 'likelihood' else 'at least'} {limit})"

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> GateChoice:
        """The choice a trial log's settings record (:meth:`settings`, beside ``gate``)."""
        auto = settings.get("gate_auto")
        gate = settings.get("gate", "published")
        return cls(gate, "auto", auto["parameters"]) if auto else cls(gate, gate, 0)

    def settings(self) -> dict[str, Any]:
        """What a trial log records beside ``gate`` when the gate was chosen automatically."""
        if self.requested != "auto":
            return {}
        return {"gate_auto": {"parameters": self.parameters, "likelihood_below": AUTO_LIKELIHOOD_BELOW}}


def check_gate(gate: str) -> str:
    """Refuse a gate name that is not one of :data:`GATES`."""
    if gate not in GATES:
        raise HeadprobeError(f"{param('gate', gate)}: expected one of {', '.join(GATES)}")
    return gate


def choose_gate(gate: str, model: LoadedModel | PreTrainedModel) -> GateChoice:
    """The gate a retrieval-reasoning pass uses on ``model``.

    Parameters
    ----------
    gate
        ``"published"``, ``"likelihood"``, or ``"auto"``: the likelihood gate for models with fewer than
        :data:`AUTO_LIKELIHOOD_BELOW` parameters, the published gate for larger ones.
    model
        A :class:`~headprobe.models.loading.LoadedModel` or a transformers model.
    """
    check_gate(gate)
    hf_model = getattr(model, "model", model)
    parameters = int(sum(p.numel() for p in hf_model.parameters()))
    if gate == "auto":
        gate = "likelihood" if parameters < AUTO_LIKELIHOOD_BELOW else "published"
        return GateChoice(gate, "auto", parameters)
    return GateChoice(gate, gate, parameters)
