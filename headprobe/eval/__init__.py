"""Evaluation: needle and reasoning-in-a-haystack grids, outside QA datasets, head ablation.

- :func:`run_eval` runs settings (allocation × policy × capacity) over a length × depth grid and writes a
  ``headprobe.eval`` result with accuracy, real cache bytes and time per token, resumable cell by cell.
- :func:`run_setting` generates one answer under one setting and measures it (bytes, time, new tokens);
  :class:`CellLog` logs finished cells and resumes; the grid and the dataset task both use them.
- :mod:`.babi` generates bAbI-style multi-fact questions to hide in the haystack.
- :func:`run_dataset_eval` answers a LongBench-style dataset (context / question / answers) with token-F1.
- :class:`HeadAblation` / :func:`run_ablation` mask query heads (uniform attention) and measure the damage.
"""

from .ablation import HeadAblation, format_ablation, random_heads, run_ablation, top_heads
from .answer_scores import SCORERS, exact_answer, rouge_l_f1, score_answer
from .babi import TASKS as BABI_TASKS
from .babi import BabiQuestion, generate_questions
from .cell_log import CellLog, cell_log_path
from .datasets import QAExample, load_qa_dataset, run_dataset_eval
from .items import LONGGEN_QUESTION, EvalItem, items_from_babi, items_from_longgen, items_from_needles
from .result import EVAL_FORMAT, EVAL_VERSION, EvalResult, format_summary
from .runner import EvalRequest, run_eval
from .setting_run import SettingRun, count_new_tokens, run_setting
from .settings import PRESETS, EvalSetting, expand_settings, parse_setting

__all__ = [
           "BABI_TASKS",
           "EVAL_FORMAT",
           "EVAL_VERSION",
           "LONGGEN_QUESTION",
           "PRESETS",
           "SCORERS",
           "BabiQuestion",
           "CellLog",
           "EvalItem",
           "EvalRequest",
           "EvalResult",
           "EvalSetting",
           "HeadAblation",
           "QAExample",
           "SettingRun",
           "cell_log_path",
           "count_new_tokens",
           "exact_answer",
           "expand_settings",
           "format_ablation",
           "format_summary",
           "generate_questions",
           "items_from_babi",
           "items_from_longgen",
           "items_from_needles",
           "load_qa_dataset",
           "parse_setting",
           "random_heads",
           "rouge_l_f1",
           "run_ablation",
           "run_dataset_eval",
           "run_eval",
           "run_setting",
           "score_answer",
           "top_heads",
]
