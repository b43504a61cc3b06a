"""--until-stable: trials in spread order, stop when the top-k heads are stable, resume from the trial log to
the same stop; the log and the profile say how the profile was made."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import headprobe
from headprobe import HeadprobeError, ProfileRequest, StopRule, run_profile
from headprobe.probes.bootstrap import BootstrapSettings
from headprobe.probes.early_stop import run_until_stable, stability
from headprobe.probes.trial_grid import make_grid
from headprobe.probes.trial_order import spread_order

RULE = StopRule(k=3, jaccard=0.9, check_every=4, min_passed=6, bootstrap=BootstrapSettings(resamples=100))


def _synthetic_trial(spec, rng) -> dict:
    """Heads 0-2 of 10 carry the signal; noise fades as it averages out."""
    scores = rng.uniform(0, 0.6, 10)
    scores[:3] += 0.5
    return {"trial": spec.id, "needle": spec.needle_id, "gates": {"published": True},
            "scores": {"enhanced_retrieval": [scores.round(6).tolist()]}}


def _runner(done: dict, log: list):
    def run_chunk(chunk):
        for spec in chunk:
            rng = np.random.default_rng(abs(hash(spec.id)) % 2**32)
            done[spec.id] = _synthetic_trial(spec, rng)
            log.append(spec.id)
    return run_chunk


def test_stops_at_a_check_once_stable_and_a_resumed_run_stops_there_too():
    grid = make_grid([f"n{i}" for i in range(6)], [100, 200, 300], [0.0, 0.5, 1.0], [0])
    order = spread_order(grid)
    done, log = {}, []
    outcome = run_until_stable(order, done, _runner(done, log), {"enhanced_retrieval": "published"}, RULE)
    assert outcome.stable and outcome.trials < outcome.grid == len(grid)
    assert outcome.trials % RULE.check_every == 0 and log == [t.id for t in order[:outcome.trials]]
    assert min(outcome.jaccard.values()) >= RULE.jaccard
    before = stability([done[i] for i in log[:outcome.trials - RULE.check_every]], {"enhanced_retrieval": "published"},
                       RULE)
    assert before is None or min(before.values()) < RULE.jaccard      # the check before did not stop it
    # interrupted in the middle of a chunk: three trials of the last chunk logged, one of them out of order
    partial_ids = log[:outcome.trials - RULE.check_every] + log[-3:]
    resumed = {i: done[i] for i in partial_ids}
    again = run_until_stable(order, resumed, _runner(resumed, []), {"enhanced_retrieval": "published"}, RULE)
    assert (again.trials, again.stable, set(resumed)) == (outcome.trials, True, set(done))


def test_runs_the_whole_grid_when_never_stable():
    grid = make_grid(["a", "b"], [100], [0.0, 0.5, 1.0], [0])
    done: dict = {}
    rule = StopRule(k=3, jaccard=1.0, check_every=4, min_passed=100)
    outcome = run_until_stable(spread_order(grid), done, _runner(done, []), {"enhanced_retrieval": "published"}, rule)
    assert not outcome.stable and outcome.trials == outcome.grid == len(done) == 6 and outcome.jaccard is None


@pytest.mark.parametrize(("kw", "message"), [
    ({"until_stable": {"k": 0}}, "stable_k=0: expected a positive number of heads"),
    ({"until_stable": {"jaccard": 1.5}}, "stable_jaccard=1.5: expected a Jaccard index in (0, 1]"),
    ({"until_stable": {}, "shard": (0, 2)}, "until_stable: cannot stop early on a shard"),
    ({"mode": "reuse", "recompute_share": 2.0}, "recompute_share=2.0: expected a share between 0 and 1"),
])
def test_bad_settings_are_refused_in_one_line(kw, message, tmp_path):
    from headprobe.probes.request import check_request

    with pytest.raises(HeadprobeError) as info:
        if "until_stable" in kw:
            kw = {**kw, "until_stable": StopRule(**kw["until_stable"])}
        check_request(ProfileRequest(probes=["retrieval"], lengths=[500], depths=[0.5], out_dir=tmp_path, **kw))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_command_line_spells_the_flags(capsys):
    from headprobe_cli.main import main

    assert main(["profile", "--mode", "reuse", "--recompute-share", "150"]) == 2
    assert capsys.readouterr().err.strip() == ("headprobe: error: --recompute-share 150.0: expected a percentage "
                                               "between 0 and 100")
    assert main(["profile", "--until-stable", "--stable-k", "0", "--lengths", "300", "--probe", "retrieval",
                 "--model", "/no/such/model"]) == 2
    assert "--stable-k 0: expected a positive number of heads" in capsys.readouterr().err


def _request(out, **kw) -> ProfileRequest:
    rule = StopRule(k=5, jaccard=0.6, check_every=4, min_passed=4, bootstrap=BootstrapSettings(resamples=100))
    return ProfileRequest(probes=["retrieval", "enhanced_retrieval"], lengths=[300, 450], depths=[0.0, 0.5, 1.0],
                          out_dir=out, mode="reuse", recompute_share=0.0,
                          needle_ids=["r01", "r02", "r03", "r04", "r05"], until_stable=rule, **kw)


@pytest.mark.slow
def test_until_stable_stops_and_resumes_from_the_log(smollm2, one_thread, tmp_path, capsys):
    from headprobe_cli.main import main

    full = tmp_path / "run"
    result = run_profile(smollm2, _request(full))
    outcome = result.stopping["retrieval"]
    assert outcome.stable and outcome.trials < outcome.grid == 30 and outcome.trials % 4 == 0
    log_path = full / "smollm2-135m.retrieval.trials.jsonl"
    settings, records = headprobe.read_log(log_path)
    assert len(records) == outcome.trials
    assert settings["mode"] == "reuse" and settings["recompute_share"] == 0.0
    assert settings["until_stable"] == {**_request(full).until_stable.to_json()}
    assert [r["trial"] for r in records] != sorted(r["trial"] for r in records)        # spread, not grid order
    profile = headprobe.Profile.load(full / "smollm2-135m.retrieval.json")
    stop = profile.trials["stopping"]
    assert stop["trials_run"] == outcome.trials and stop["grid_trials"] == 30 and stop["rule"]["k"] == 5
    assert profile.probe["until_stable"]["jaccard"] == 0.6 and profile.probe["mode"] == "reuse"

    # an interrupted run: the first chunk, two trials of the second and a torn line; resume finishes it
    lines = log_path.read_text().splitlines()
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / log_path.name).write_text("\n".join(lines[:7]) + "\n" + lines[7][:50])
    with pytest.raises(HeadprobeError, match="pass resume=True"):
        run_profile(smollm2, _request(cut))
    other_rule = dataclasses.replace(_request(cut, resume=True),
                                     until_stable=StopRule(k=6, jaccard=0.6, check_every=4, min_passed=4))
    with pytest.raises(HeadprobeError, match="until_stable"):
        run_profile(smollm2, other_rule)                         # a log never mixes stopping rules
    resumed = run_profile(smollm2, _request(cut, resume=True))
    assert resumed.trials_skipped == 6 and resumed.stopping["retrieval"].trials == outcome.trials
    _, again = headprobe.read_log(cut / log_path.name)
    assert {r["trial"] for r in again} == {r["trial"] for r in records}
    for kind in ("retrieval", "enhanced_retrieval"):
        a = headprobe.Profile.load(full / f"smollm2-135m.{kind}.json")
        b = headprobe.Profile.load(cut / f"smollm2-135m.{kind}.json")
        np.testing.assert_allclose(b.query_heads, a.query_heads, atol=1e-6)
        assert b.trials["stopping"] == a.trials["stopping"]

    assert main(["inspect", str(full / "smollm2-135m.retrieval.json"), str(log_path)]) == 0
    out = capsys.readouterr().out
    assert f"until stable: {outcome.trials} of 30 grid trials run in spread order; top-5 stable" in out
    assert "stopping   until the top-5 heads are stable (bootstrap Jaccard >= 0.6), checked every 4 trials" in out
    assert json.loads(log_path.read_text().splitlines()[0])["settings"]["until_stable"]["order"] == "spread"


@pytest.mark.slow
def test_stability_plot_from_a_stopped_run(smollm2, one_thread, tmp_path):
    result = run_profile(smollm2, _request(tmp_path))
    profile = headprobe.Profile.load(tmp_path / "smollm2-135m.enhanced_retrieval.json")
    fig = headprobe.stability_figure(profile, top=10, log=headprobe.read_log(result.logs[0]))
    intervals, curve = fig.axes
    assert len(intervals.get_yticklabels()) == 10 and "bootstrap interval" in intervals.get_xlabel()
    xs = curve.lines[0].get_xdata()
    assert xs[-1] == result.stopping["retrieval"].trials and curve.lines[1].get_ydata()[0] == 0.6
    path = headprobe.save_figure(fig, tmp_path / "stability.png")
    assert path.stat().st_size > 10_000


@pytest.mark.slow
def test_profile_command_writes_the_stability_plot(smollm2, one_thread, tmp_path, capsys):
    from headprobe_cli.main import main

    assert main(["profile", "--mode", "reuse", "--recompute-share", "0", "--probe", "retrieval",
                 "--lengths", "300", "--depths", "0", "50", "100", "--needles", "r01", "r02",
                 "--out-dir", str(tmp_path), "--plot-stability"]) == 0
    captured = capsys.readouterr()
    assert "reuse mode, recompute share 0%" in captured.err
    png = tmp_path / "smollm2-135m.retrieval.stability.png"
    assert png.stat().st_size > 10_000 and f"wrote {png}" in captured.out
