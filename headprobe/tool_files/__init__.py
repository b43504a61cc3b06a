"""Files other tools read and write: DuoAttention patterns, HeadKV / Retrieval_Head score JSON,
per-layer budget lists."""
