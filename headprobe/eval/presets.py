"""Eval presets: each method at its authors' published setting, with where every number comes from.

A preset names a policy, an allocation and the profiles it reads, plus the policy options that differ
from the policy's own defaults. :data:`PUBLISHED` records, per preset, the settings its method was
published with and the source of each; ``docs/eval.md`` ("Published defaults") prints the same table and
a test checks that every preset really runs with them. The observation window is the setting that
differs most between methods: SnapKV's authors ran a 32-token window, HeadKV's and PyramidKV's an
8-token one; :data:`EVAL_PRESETS` keeps each at its own, and a setting can override any of them
(``snapkv[window=8]``, ``headkv-r[window=question]``) to compare methods at one window.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SNAPKV_REPO = "FasterDecoding/SnapKV"
HEADKV_REPO = "FYYFU/HeadKV"
FACTORY_REPO = "Zefan-Cai/KVCache-Factory"
KVPRESS_REPO = "NVIDIA/kvpress"
DYNAMICKV_REPO = "DreamMr/DynamicKV"


@dataclass(frozen=True)
class Preset:
    """One preset and the published setting it runs at.

    Attributes
    ----------
    policy
        Runtime policy name.
    allocation
        Allocation method (``None``: the policy's uniform capacity).
    profiles
        Profile kinds the allocation reads.
    options
        Policy options that differ from the policy class's defaults.
    published
        The method's published setting (policy options, and the allocation's options: HeadKV's ``beta``,
        PyramidKV's ``taper``), the values the preset runs with.
    sources
        Where each published value comes from, in the order of ``published``.
    kvpress
        kvpress's defaults for the same method where they differ from ``published`` (for reference; not
        used).
    """

    policy: str
    allocation: str | None = None
    profiles: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    published: dict[str, Any] = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    kvpress: dict[str, Any] = field(default_factory=dict)


_HEADKV_SELECTION = {"window": 8, "kernel_size": 7, "pooling": "max"}
_HEADKV_SOURCES = (
    ("HeadKV paper, Sec. 4.1: local window alpha = 8 for the baselines and HeadKV (App. G: the other "
     "hyper-parameters as in the PyramidKV codebase)"),
    (f"{HEADKV_REPO} run_needle_in_haystack.py / run_longbench.py: window_size = 8, kernel_size = 7, "
    "pooling = maxpool"),
    ("beta: the paper sweeps {1.005, 1.01, 1.1, 1.2, 1.5, 2, 5, 10} and reports the best; no single default "
    f"({HEADKV_REPO} run scripts: 1.5, {FACTORY_REPO} run_longbench.py: 1.01); headprobe uses 1.2"),
)

#: Preset name -> the preset and its published setting.
PUBLISHED: dict[str, Preset] = {
    "full": Preset("full"),
    "streaming": Preset(
        "streaming", published={"sink": 4},
        sources=(("StreamingLLM paper: 4 initial tokens as attention sinks, the rest a recent window "
                 f"({FACTORY_REPO} run_longbench.py: window = capacity - 4; {KVPRESS_REPO} "
                 "StreamingLLMPress: n_sink = 4)"),)),
    "snapkv": Preset(
        "snapkv", "uniform", options={"window": 32},
        published={"window": 32, "kernel_size": 7, "pooling": "max"},
        sources=((f"{SNAPKV_REPO} experiments/LongBench/config/ablation_c{{1024,2048,4096}}_w32_k7_maxpool.json: "
                 "window_sizes 32, kernel_sizes 7, pooling maxpool (the paper's LongBench runs)"),
                 f"{SNAPKV_REPO} snapkv_utils.init_snapkv: window_size 32 (kernel 5, avgpool when unset)",
                 f"{FACTORY_REPO} run_needle_in_haystack.py: SnapKV window 32, kernel 7, maxpool"),
        kvpress={"window": 64, "kernel_size": 5, "pooling": "avg"}),
    "pyramid": Preset(
        "snapkv", "pyramid", published={**_HEADKV_SELECTION, "taper": 20},
        sources=((f"{FACTORY_REPO} (PyramidKV's code) run_longbench.py and run_needle_in_haystack.py: "
                 "window 8, kernel 7, maxpool; PyramidKVCluster beta = 20 (headprobe's taper)"),),
        kvpress={"window": 64, "kernel_size": 5, "pooling": "avg"}),
    "dynamickv": Preset(
        "dynamickv", published={"window": 8, "kernel_size": 7, "r_max": 10, "interval": 4},
        sources=((f"{DYNAMICKV_REPO} run/longbench/scripts: WINDOW_SIZE=8, KERNEL_SIZES=7, RADIO_MAX=10 "
                 "(POOLING maxpool for Mistral and Qwen, avgpool for Llama and InternLM; headprobe pools "
                 "with max)"),
                 (f"{DYNAMICKV_REPO} llama_model_impl/dynamickv_v11.py: budgets re-split every 4 layers "
                 "(layer_idx % 4 == 3)"))),
    "headkv-r": Preset("snapkv", "headkv", ("retrieval",), published={**_HEADKV_SELECTION, "beta": 1.2},
                       sources=_HEADKV_SOURCES),
    "headkv-er": Preset("snapkv", "headkv", ("enhanced_retrieval",), published={**_HEADKV_SELECTION, "beta": 1.2},
                        sources=_HEADKV_SOURCES),
    "headkv-r2": Preset("snapkv", "headkv", ("retrieval_reasoning",),
                        published={**_HEADKV_SELECTION, "beta": 1.2}, sources=_HEADKV_SOURCES),
    "combined": Preset(
        "snapkv", "combined", ("retrieval_reasoning", "layer_retention"),
        published={**_HEADKV_SELECTION, "beta": 1.2},
        sources=("headprobe's own combination (unpublished); selection as HeadKV's",)),
    "keydiff": Preset(
        "keydiff", options={"block_size": 128}, published={"block_size": 128, "window": 0, "anchor": "normalized"},
        sources=("KeyDiff paper, Sec. 4: block size B = 128 for prompt processing; no recent window",
                 (f"anchor: the paper's Eq. 7 and {KVPRESS_REPO} KeyDiffPress use the mean of normalised keys; "
                 "the paper's experiments use the raw mean (its Table 15: no accuracy difference)"))),
    "morphkv": Preset(
        "morphkv", published={"window": 32, "fuse": "sum"},
        sources=(("MorphKV paper, Sec. 5.3 (LongBench): recent window R = 32 tokens, sum() fusion "
                 "(30 for LongWriter, Sec. 5.1; 200 with max() for LongGenBench, Sec. 5.2)"),)),
    "keepkv": Preset(
        "keepkv", published={"window": 8, "threshold": 0.8},
        sources=("KeepKV paper, App. B.3: merging threshold T = 0.8",
                 ("window: the paper gives no observation window (it scores with a recent window as SnapKV "
                 "and PyramidInfer do); headprobe uses HeadKV's 8"))),
}

#: The ``window`` option value that sets a policy's observation window to the question: the tokens from
#: the question's first token to the end of the prompt (question + what follows it: the answer
#: instruction, the chat template's end, a response prefix), measured on every trial's prompt.
QUESTION_WINDOW = "question"

#: name -> (policy, allocation, profiles, policy options), the form :func:`~.settings.parse_setting` reads.
EVAL_PRESETS: dict[str, tuple[str, str | None, tuple[str, ...], dict[str, Any]]] = {
    name: (p.policy, p.allocation, p.profiles, dict(p.options)) for name, p in PUBLISHED.items()}


_WINDOW_SUFFIX = re.compile(r"\[window=[^\],]+\]$")


def describe_window(setting: Mapping[str, Any], windows: Sequence[int] = ()) -> tuple[str, str, str]:
    """How a setting of a result file (``EvalSetting.to_json()``) treats the observation window.

    Parameters
    ----------
    setting
        One entry of a result's ``settings``.
    windows
        The windows its trials recorded (a question window's sizes).

    Returns
    -------
    method, window, kind
        The setting's name without a ``[window=...]`` suffix; the window (``"32"``, ``"question
        (29–34)"``, ``"none"`` for policies without an observation window, ``"–"`` for the full cache);
        ``"published"`` (a preset with its published options), ``"matched"`` (a preset with only its
        window changed) or ``"custom"``.
    """
    # the runtime (torch) loads here: settings parse, and `headprobe --help` runs, without it
    from ..runtime.policies import POLICIES

    name, policy, options = setting["name"], setting["policy"], setting.get("options") or {}
    if policy == "full":
        return name, "–", "–"
    method = _WINDOW_SUFFIX.sub("", name)
    policy_class = POLICIES.get(policy)
    if policy_class is None or not policy_class.observes_window:     # StreamingLLM, KeyDiff: no observation window
        window = "none"
    elif options.get("window") == QUESTION_WINDOW:
        window = f"question ({min(windows)}–{max(windows)})" if windows else "question"
    else:
        window = str(options.get("window", policy_class.window))
    if name in EVAL_PRESETS and options == EVAL_PRESETS[name][3]:
        kind = "published"
    elif method in EVAL_PRESETS and set(options) - set(EVAL_PRESETS[method][3]) <= {"window"}:
        kind = "matched"
    else:
        kind = "custom"
    return method, window, kind
