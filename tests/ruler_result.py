"""A hand-made RULER eval result with known scores and bytes: two tasks at 2048 tokens, the full cache, one
headprobe method and one kvpress press at two compression ratios each (for the figure's tests)."""

from __future__ import annotations

from headprobe.eval.result import EvalResult

#: prompt tokens 1000, so ratio 0.5 keeps 500 tokens a head and 0.9 keeps 100
RATIOS = {"0.5": 500, "0.9": 100}


def _trial(task: str, score: float, cache: int, full: int = 1000) -> dict:
    return {"task": task, "length": 2048, "score": score, "cache_bytes": cache, "used_bytes": cache,
            "full_cache_bytes": full, "item": f"{task}-{score}-{cache}", "new_tokens": 4, "seconds": 0.5}


def _setting(label: str, name: str, capacity: int | None) -> dict:
    return {"label": label, "name": name, "policy": "full" if name == "full" else name.split(":")[-1],
            "capacity": capacity}


def ruler_result() -> EvalResult:
    """Scores per (setting, task): full niah 1, 1 / qa 1, 0; snapkv@500 niah 1, 1 / qa 0, 0; snapkv@100
    niah 1, 0 / qa 0, 0; kvpress:snapkv@500 niah 0, 0 / qa 1, 0 (its cache masks: full bytes);
    kvpress:snapkv@100 all 0. Bytes per trial as written below."""
    rows = {
        "full": [("niah_single_1", 1, 1000), ("niah_single_1", 1, 1000), ("qa_1", 1, 1000), ("qa_1", 0, 1000)],
        "snapkv@500": [("niah_single_1", 1, 520), ("niah_single_1", 1, 500), ("qa_1", 0, 510), ("qa_1", 0, 530)],
        "snapkv@100": [("niah_single_1", 1, 120), ("niah_single_1", 0, 100), ("qa_1", 0, 100), ("qa_1", 0, 100)],
        "kvpress:snapkv@500": [("niah_single_1", 0, 1000), ("niah_single_1", 0, 1000), ("qa_1", 1, 1000),
                               ("qa_1", 0, 1000)],
        "kvpress:snapkv@100": [("niah_single_1", 0, 1000), ("niah_single_1", 0, 1000), ("qa_1", 0, 1000),
                               ("qa_1", 0, 1000)],
    }
    settings = [_setting("full", "full", None), _setting("snapkv@500", "snapkv", 500),
                _setting("snapkv@100", "snapkv", 100), _setting("kvpress:snapkv@500", "kvpress:snapkv", 500),
                _setting("kvpress:snapkv@100", "kvpress:snapkv", 100)]
    cells = [{"setting": label, "accuracy": sum(r[1] for r in trials) / len(trials),
              "trials": [_trial(*r) for r in trials]} for label, trials in rows.items()]
    return EvalResult({"name": "tiny/ruler-model"}, {"kind": "ruler", "ratios": RATIOS}, {}, settings, cells)
