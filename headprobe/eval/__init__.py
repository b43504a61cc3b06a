"""Evaluation: needle and reasoning-in-a-haystack grids, outside QA datasets, head ablation.

- :func:`run_eval` runs settings (allocation × policy × capacity) over a length × depth grid and writes a
  ``headprobe.eval`` result with accuracy, real cache bytes and time per token, resumable cell by cell.
- :func:`run_setting` generates one answer under one setting and measures it (bytes, time, new tokens);
  :class:`CellLog` logs finished cells and resumes; the grid and the dataset task both use them.
- :mod:`.babi` generates bAbI-style multi-fact questions to hide in the haystack.
- :func:`run_dataset_eval` answers a LongBench-style dataset (context / question / answers) with token-F1.
- :class:`HeadAblation` / :func:`run_ablation` mask query heads (uniform attention) and measure the damage.

Names are imported from their modules on first use (see :mod:`headprobe.lazy_exports`): the settings and
the bAbI task names do not load torch.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "HeadAblation": "ablation",
    "format_ablation": "ablation",
    "random_heads": "ablation",
    "run_ablation": "ablation",
    "top_heads": "ablation",
    "SCORERS": "answer_scores",
    "exact_answer": "answer_scores",
    "rouge_l_f1": "answer_scores",
    "score_answer": "answer_scores",
    "BABI_TASKS": "babi",
    "BabiQuestion": "babi",
    "generate_questions": "babi",
    "QAExample": "datasets",
    "load_qa_dataset": "datasets",
    "run_dataset_eval": "datasets",
    "LONGGEN_QUESTION": "items",
    "EvalItem": "items",
    "items_from_babi": "items",
    "items_from_longgen": "items",
    "items_from_needles": "items",
    "EVAL_FORMAT": "result",
    "EVAL_VERSION": "result",
    "EvalResult": "result",
    "format_eval_summary": "result",
    "EvalRequest": "runner",
    "CellLog": "cell_log",
    "cell_log_path": "cell_log",
    "SettingRun": "setting_run",
    "count_new_tokens": "setting_run",
    "run_setting": "setting_run",
    "run_eval": "runner",
    "EVAL_PRESETS": "settings",
    "EvalSetting": "settings",
    "expand_settings": "settings",
    "expand_specs": "settings",
    "parse_setting": "settings",
    "parse_settings": "settings",
    "SettingSpec": "settings",
})
