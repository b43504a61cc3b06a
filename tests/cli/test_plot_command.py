"""``headprobe plot A.json B.json`` on a plain install: no scipy needed, and the ρ it prints is Spearman's."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from headprobe.models.identity import ModelIdentity
from headprobe.plots.profile_figures import average_ranks, spearman
from headprobe.profile import Profile, reduce_groups

ROOT = Path(__file__).resolve().parents[2]
MODEL = ModelIdentity(name="m/tiny", source="test", architecture="llama", num_layers=6, num_query_heads=4,
                      num_kv_heads=2, head_dim=8, layer_types=("full_attention",) * 6)


def _profile(kind: str, seed: int) -> Profile:
    q = np.random.default_rng(seed).integers(0, 4, (6, 4)).astype(float).tolist()   # many ties
    return Profile(kind=kind, model=MODEL, probe={}, trials={"total": 2, "passed": 2}, query_heads=q,
                   kv_heads=reduce_groups(q, 2, "mean"))


def test_compare_plot_runs_without_scipy(tmp_path):
    _profile("retrieval", 0).save(tmp_path / "a.json")
    _profile("retrieval_reasoning", 1).save(tmp_path / "b.json")
    blocked = ("import sys; sys.modules['scipy'] = None\n"   # as if scipy were not installed
               "from headprobe_cli.main import main\n"
               "rc = main(['plot', 'a.json', 'b.json', '-o', 'c.png'])\n"
               "assert 'scipy.stats' not in sys.modules\n"
               "sys.exit(rc)")
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")])}
    proc = subprocess.run([sys.executable, "-c", blocked], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "c.png").stat().st_size > 10_000


def test_spearman_equals_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 30, 270):
        a, b = rng.integers(0, 5, n).astype(float), rng.random(n)
        assert np.array_equal(average_ranks(a), stats.rankdata(a))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # scipy warns on a constant input (n = 1)
            want = stats.spearmanr(a, b).statistic
        got = spearman(a, b)
        assert (np.isnan(want) and np.isnan(got)) or abs(want - got) < 1e-12
    assert np.isnan(spearman(np.ones(5), np.arange(5.0)))   # a constant side has no ranking


def test_plot_of_a_ruler_result_draws_the_ruler_figure_and_other_commands_refuse_it(tmp_path, capsys):
    from headprobe_cli.main import main
    from ruler_result import ruler_result

    path = ruler_result().save(tmp_path / "ruler.json")
    assert main(["plot", str(path)]) == 0
    assert (tmp_path / "ruler.eval.png").stat().st_size > 10_000
    assert main(["plot", str(path)]) == 2                      # an existing figure needs --force
    assert main(["plot", str(path), "--kind", "heads"]) == 2
    assert main(["inspect", str(path)]) == 0
    assert "headprobe eval v1, task ruler" in capsys.readouterr().out
    assert main(["export", str(path), "--to", "duoattention", "-o", str(tmp_path / "duo")]) == 2
    err = capsys.readouterr().err
    assert "an eval result; export takes a profile or a budget map" in err
    assert not (tmp_path / "duo").exists()
