"""Evaluation: needle and reasoning-in-a-haystack grids, outside QA datasets, head ablation.

- :func:`run_eval` runs settings (allocation × policy × capacity) over a length × depth grid and writes a
  ``headprobe.eval`` result with accuracy, real cache bytes and time per token, resumable cell by cell.
- :func:`run_setting` generates one answer under one setting and measures it (bytes, time, new tokens);
  :class:`CellLog` logs finished cells and resumes; the grid and the dataset task both use them.
- :mod:`.babi` generates bAbI-style multi-fact questions to hide in the haystack.
- :func:`run_dataset_eval` answers a LongBench-style dataset (context / question / answers) with token-F1.
- :class:`HeadAblation` / :func:`run_ablation` mask query heads (uniform attention) and measure the damage.
"""
