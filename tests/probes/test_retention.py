"""Layer retention on a tiny Gemma 3 (sliding-window layers)."""

from __future__ import annotations


def test_retention_on_tiny_gemma_sums_to_one():
    import conftest

    from headprobe.haystack.tasks import TaskSample
    from headprobe.probes.retention import RetentionConfig, run_retention_sample

    lm = conftest.make_tiny_gemma3()
    sample = TaskSample("s1", "single_doc_qa", "The river ran past the old mill. " * 20, "Where did it run?")
    record = run_retention_sample(lm, sample, RetentionConfig(capacity=4, max_tokens=120, chat_template=False))
    assert len(record["retention"]) == 4 and abs(sum(record["retention"]) - 1) < 1e-5
