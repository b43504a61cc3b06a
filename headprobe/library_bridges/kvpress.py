"""kvpress presses that read headprobe files (``pip install "headprobe[kvpress]"``).

kvpress (NVIDIA/kvpress) compresses a transformers ``DynamicCache`` during prefill with a *press*. Its
head-wise mechanism (used by ``AdaKVPress`` and ``DuoAttentionPress``) does not shorten the cache: a press
sets ``module.masked_key_indices`` and kvpress' attention patch replaces those keys by a key no query
attends to while decoding. The presses here plug headprobe's results into that mechanism:

- :class:`BudgetMapPress`: fixed per-(layer, KV head) budgets from a headprobe budget map (or a profile
  allocated on the fly), resolved for each prompt exactly as headprobe's runtime resolves them
  (:class:`~headprobe.runtime.budget_sources.MapBudget`); a kvpress ``ScorerPress`` (default ``SnapKVPress``) ranks the
  tokens inside each head, and the map's window and sink are always kept.
- :class:`DuoAttentionFolderPress`: kvpress' ``DuoAttentionPress`` reading a local pattern folder (a
  headprobe export or any DuoAttention folder) instead of downloading one of six patterns, as
  ``[layers][kv_heads]`` even for models with one KV head, with the exported ``sparsity`` as default
  ``head_compression_ratio``.
- :func:`per_layer_press`: kvpress' ``PerLayerCompressionPress`` with the removal ratios of
  :func:`headprobe.tool_files.layer_list.kvpress_layer_ratios`.

Importing this module imports kvpress, which patches transformers' attention functions (kvpress does so
on import). Attention must not be ``"eager"`` (kvpress' masking needs the patched sdpa / flash paths).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

try:
    from kvpress import BasePress, DuoAttentionPress, PerLayerCompressionPress, ScorerPress, SnapKVPress
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError('headprobe.library_bridges.kvpress needs kvpress: pip install "headprobe[kvpress]"') from exc

from ..allocation.api import allocate
from ..budget_map import BudgetMap
from ..errors import FileFormatError, HeadprobeError, param
from ..models.identity import identity_from_config, text_config
from ..profile import Profile
from ..runtime.budget_sources import MapBudget
from ..runtime.shape import CacheShape
from ..tool_files.duoattention import CONFIG_NAME, DUO_CUT, TSV_NAME
from ..tool_files.layer_list import kvpress_layer_ratios

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class _Window:
    """What :meth:`MapBudget.resolve` reads of a policy: the tokens every head keeps."""

    window: int
    name: str = "budget map"
    uses_budgets: ClassVar[bool] = True


@dataclass
class BudgetMapPress(BasePress):
    """Fixed per-(layer, KV head) budgets from a headprobe budget map, through kvpress' head-wise masking.

    For a context of ``N`` tokens each KV head keeps the budget headprobe's runtime would give it
    (:class:`~headprobe.runtime.budget_sources.MapBudget`: the map's budgets, or its shares at ``capacity`` tokens per
    head on average, clamped to ``N`` with the excess redistributed). Inside a head the map's last
    ``window`` and first ``sink`` tokens are always kept, the rest of the budget goes to the tokens
    ``press`` scores highest; every other key is masked for decoding. Sliding-window layers (Gemma 3)
    are left as they are, as in headprobe's runtime.

    Parameters
    ----------
    budget_map
        A :class:`~headprobe.BudgetMap` (``granularity="kv_head"``) or the path of a budget file.
    press
        The kvpress ``ScorerPress`` that ranks tokens inside a head (default ``SnapKVPress`` with the
        map's window as ``window_size`` and ``kernel_size=7``).
    capacity
        Mean tokens per KV head to rescale the map to (``None``: the map's own budgets).

    Attributes
    ----------
    kept_tokens_
        ``int64 [layers][kv_heads]`` tokens each head keeps after the last prefill (batch row 0).
    context_tokens_
        Tokens of the last compressed context.

    Examples
    --------
    >>> press = BudgetMapPress("budgets/smollm2.headkv.json")          # doctest: +SKIP
    >>> pipe(context, question=question, press=press)["answer"]       # doctest: +SKIP
    """

    budget_map: BudgetMap | str | os.PathLike
    press: ScorerPress | None = None
    capacity: int | None = None
    kept_tokens_: torch.Tensor | None = field(init=False, default=None)
    context_tokens_: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if not isinstance(self.budget_map, BudgetMap):
            self.budget_map = BudgetMap.load(self.budget_map)
        bm = self.budget_map
        if bm.granularity != "kv_head":
            raise HeadprobeError("kvpress compresses per KV head; this budget map is per query head "
                                 f"(made with {param('compat', 'headkv')})")
        self.window = int(bm.method.get("window") or 0)
        self.sink = int(bm.method.get("sink") or 0)
        if self.press is None:
            self.press = SnapKVPress(window_size=max(self.window, 1), kernel_size=7)
        if not isinstance(self.press, ScorerPress):
            raise HeadprobeError(f"{param('press')} must be a kvpress ScorerPress (it ranks tokens inside a head), "
                                 f"got {type(self.press).__name__}")
        self._source = MapBudget(bm, capacity=self.capacity)
        self._layer_types: tuple[str, ...] | None = None
        self._resolved: dict[int, torch.Tensor] = {}

    @classmethod
    def from_profile(cls, profile: Profile | str | os.PathLike, press: ScorerPress | None = None, *,
                     capacity: int = 128, window: int = 8, beta: float = 1.2, sink: int = 0,
                     **allocate_options: Any) -> BudgetMapPress:
        """HeadKV budgets allocated from a head-score profile (:func:`headprobe.allocate`), as a press."""
        if not isinstance(profile, Profile):
            profile = Profile.load(profile)
        bm = allocate("headkv", [profile], capacity=capacity, window=window, beta=beta, sink=sink,
                      **allocate_options)
        return cls(bm, press=press)

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        self.press.post_init_from_model(model)
        found = identity_from_config(model.config, self.budget_map.model.name, "kvpress")
        self.budget_map.model.check_fits(found, what="budget map")
        self._layer_types = found.layer_types
        self._resolved = {}

    def budgets_for(self, context_len: int) -> torch.Tensor:
        """``int64 [layers][kv_heads]`` tokens each head keeps of a ``context_len``-token context."""
        if context_len not in self._resolved:
            types = self._layer_types or self.budget_map.model.layer_types
            shape = CacheShape(len(types), self.budget_map.model.num_kv_heads, tuple(types),
                               self.budget_map.model.sliding_window)
            lengths = torch.tensor([context_len])
            self._resolved[context_len] = self._source.resolve(shape, lengths, _Window(self.window))[0]
        return self._resolved[context_len]

    @property
    def compression_ratio(self) -> float:
        """Share of the last context's pairs masked (over every layer and KV head)."""
        if self.kept_tokens_ is None:
            raise HeadprobeError("no context compressed yet: the ratio is known after a prefill")
        return 1.0 - float(self.kept_tokens_.sum()) / (self.kept_tokens_.numel() * self.context_tokens_)

    @compression_ratio.setter
    def compression_ratio(self, value: float) -> None:  # noqa: ARG002 (kvpress' press interface)
        raise AttributeError("BudgetMapPress keeps the budget map's token counts; rescale with capacity=")

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        """Mask all but each head's budget (``keys`` ``[batch, kv_heads, tokens, head_dim]`` unchanged)."""
        layer = module.layer_idx
        _, heads, n, _ = keys.shape
        if layer == 0 or self.kept_tokens_ is None or self.context_tokens_ != n:
            self.kept_tokens_ = torch.full((len(self._layer_types or ()), heads), n, dtype=torch.long)
            self.context_tokens_ = n
        if self._layer_types is not None and self._layer_types[layer] == "sliding_attention":
            return keys, values
        budget = self.budgets_for(n)[layer].to(keys.device)                     # [kv_heads]
        if bool((budget >= n).all()):
            return keys, values
        if n <= getattr(self.press, "window_size", 0):                          # too short to score
            return keys, values
        scores = self.press.score(module, hidden_states, keys, values, attentions, kwargs).float()
        big = torch.finfo(scores.dtype).max
        scores[..., max(n - self.window, 0):] = big                             # the map's window
        scores[..., :self.sink] = big                                           # and its sink
        order = scores.argsort(dim=-1, descending=True, stable=True)            # [batch, kv_heads, tokens]
        rank = torch.empty_like(order)
        rank.scatter_(-1, order, torch.arange(n, device=keys.device).expand_as(order))
        masked = rank >= budget.view(1, heads, 1)
        module.masked_key_indices = torch.nonzero(masked, as_tuple=True)
        self.kept_tokens_[layer] = torch.minimum(budget.cpu(), torch.tensor(n))
        return keys, values


def read_pattern(folder: str | os.PathLike) -> tuple[int, int, np.ndarray, dict]:
    """``(sink_size, recent_size, scores, config)`` of a DuoAttention folder, read as DuoAttention does
    (clipped to [0, 1]) but always ``[layers][kv_heads]`` (``ndmin=2``)."""
    folder = Path(folder)
    tsv, cfg_path = folder / TSV_NAME, folder / CONFIG_NAME
    if not tsv.is_file() or not cfg_path.is_file():
        raise HeadprobeError(f"{folder}: expected a DuoAttention folder with {TSV_NAME} and {CONFIG_NAME}")
    scores = np.clip(np.loadtxt(tsv, dtype=float, delimiter="\t", ndmin=2), 0, 1)
    config = json.loads(cfg_path.read_text(encoding="utf-8"))
    for key in ("sink_size", "recent_size"):
        if not isinstance(config.get(key), int) or isinstance(config.get(key), bool):
            raise FileFormatError(cfg_path, key, "expected an integer")
    if config["recent_size"] < 1:
        raise FileFormatError(cfg_path, "recent_size", "expected at least 1 (kvpress keeps tokens [-recent_size:])")
    return config["sink_size"], config["recent_size"], scores, config


@dataclass
class DuoAttentionFolderPress(DuoAttentionPress):
    """kvpress' ``DuoAttentionPress`` with its pattern read from a local folder.

    Parameters
    ----------
    head_compression_ratio
        Share of KV heads made streaming (kvpress streams the ``round(n · ratio)`` lowest). ``None``:
        the folder's ``sparsity`` (what a headprobe export records exactly), else the share of values
        at or below 0.5 (DuoAttention's own cut).
    pattern_dir
        The folder (``full_attention_heads.tsv`` + ``config.json``); required.

    Examples
    --------
    >>> press = DuoAttentionFolderPress(pattern_dir="duo/")            # doctest: +SKIP
    >>> pipe(context, question=question, press=press)["answer"]       # doctest: +SKIP
    """

    head_compression_ratio: float | None = None
    pattern_dir: str | os.PathLike | None = None

    def __post_init__(self) -> None:
        if self.pattern_dir is None:
            raise HeadprobeError(f"DuoAttentionFolderPress needs {param('pattern_dir')} (a DuoAttention folder)")
        if self.on_the_fly_scoring:
            raise HeadprobeError("DuoAttentionFolderPress reads its pattern from a folder; on-the-fly scoring "
                                 "is DuoAttentionPress's")
        self._ratio_given = self.head_compression_ratio

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        sink, recent, scores, config = read_pattern(self.pattern_dir)
        cfg = text_config(model.config)
        want = (int(cfg.num_hidden_layers), int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads))
        if scores.shape != want:
            raise HeadprobeError(f"{self.pattern_dir}: pattern is {scores.shape[0]} layers x {scores.shape[1]} KV "
                                 f"heads but the model has {want[0]} x {want[1]}")
        if self._ratio_given is None:
            sparsity = config.get("sparsity")
            self.head_compression_ratio = (float(sparsity) if isinstance(sparsity, (int, float))
                                           else float((scores <= DUO_CUT).mean()))
        self._pattern = (sink, recent, scores)
        super().post_init_from_model(model)

    def load_attention_pattern(self, model: PreTrainedModel) -> tuple[int, int, np.ndarray]:  # noqa: ARG002 (kvpress' press interface)
        """The folder's ``(sink_size, recent_size, scores [layers][kv_heads])`` (replaces the download)."""
        return self._pattern


def per_layer_press(budget_map: BudgetMap | str | os.PathLike, prompt_len: int | None = None,
                    press: ScorerPress | None = None) -> PerLayerCompressionPress:
    """kvpress' ``PerLayerCompressionPress`` keeping each layer's per-head budget of ``budget_map``.

    The ratios (:func:`headprobe.tool_files.layer_list.kvpress_layer_ratios`) are exact for a context of ``prompt_len``
    tokens (default: the map's ``prompt_len``): kvpress keeps ``per_head[l]`` tokens in every head of
    layer ``l``. kvpress runs this press with flash attention only.
    """
    bm = budget_map if isinstance(budget_map, BudgetMap) else BudgetMap.load(budget_map)
    ratios = kvpress_layer_ratios(bm, prompt_len)["compression_ratios"]
    if press is None:
        press = SnapKVPress(window_size=max(int(bm.method.get("window") or 0), 1), kernel_size=7)
    return PerLayerCompressionPress(press=press, compression_ratios=ratios)


__all__ = ("BudgetMapPress", "DuoAttentionFolderPress", "per_layer_press", "read_pattern")
