"""``headprobe explain`` on the command line: its outputs, and every refusal in one line before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from headprobe_cli.main import main

import headprobe
from headprobe.budget_map import BudgetMap
from headprobe.explain.engines.headprobe_runtime import runtime_allocation
from headprobe.explain.setting import Setting

SHIPPED = headprobe.paths.shipped_profiles_dir()
R2 = str(SHIPPED / "smollm2-135m.retrieval_reasoning.json")
GEMMA = str(SHIPPED / "gemma3-270m.retrieval_reasoning.json")


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["explain", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_profile_is_explained_and_written_as_json_figure_and_budget_map(tmp_path, capsys):
    files = [tmp_path / "x.json", tmp_path / "x.png", tmp_path / "b.json"]
    code, out, _ = _run(capsys, R2, "--context", "4096", "--capacity", "64", "--json", str(files[0]), "--plot",
                        str(files[1]), "--to", "budget", "-o", str(files[2]))
    assert code == 0
    assert "the budget at 4,096 tokens" in out and "HeadKV" in out and "KVCache-Factory" in out
    assert f"run it with: headprobe generate --budget {files[2]} --policy snapkv --option window=8 PROMPT" in out
    data = json.loads(files[0].read_text())
    assert (data["format"], data["version"]) == ("headprobe.explain", 1)
    assert data["budget"]["total_tokens"] == 64 * 30 * 3
    assert files[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bm = BudgetMap.load(files[2])
    assert bm.total == 64 * 30 * 3 and bm.method["allocator"] == "headkv"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]          # no temporary files left
    before = {p: p.read_bytes() for p in files}
    for i, flag in enumerate(("--json", "--plot", "-o")):
        extra = ["--to", "budget"] if flag == "-o" else []
        code, _, err = _run(capsys, R2, "--context", "4096", flag, str(files[i]), *extra)
        assert code == 2 and err.count("\n") == 1 and "exists; pass --force" in err
    assert {p: p.read_bytes() for p in files} == before
    code, _, _ = _run(capsys, R2, "--context", "2048", "--json", str(files[0]), "--force")
    assert code == 0 and json.loads(files[0].read_text())["setting"]["context"] == 2048


def test_a_converted_map_is_a_map_generate_reads(tmp_path, capsys):
    out = tmp_path / "press.json"
    code, text, _ = _run(capsys, "--press", "snapkv", "--ratio", "0.75", "--context", "1000", "--to", "budget", "-o",
                         str(out))
    assert code == 0 and "--policy snapkv --option window=64 --option kernel_size=5 --option pooling=avg" in text
    bm = BudgetMap.load(out)
    assert (np.asarray(bm.budgets) == 250).all() and bm.model.name == "HuggingFaceTB/SmolLM2-135M-Instruct"
    row = runtime_allocation(bm, bm.model, Setting(1000), "snapkv", {"window": 64, "kernel_size": 5, "pooling": "avg"})
    assert row.runs and (row.held == 250).all()


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("bad")
    (d / "list.json").write_text("[1, 2]")
    (d / "mystery_heads.json").write_text(json.dumps({f"{layer}-{h}": [0.1] for layer in range(2) for h in range(2)}))
    compat = headprobe.allocate("headkv", [headprobe.Profile.load(R2)], compat="headkv")
    compat.save(d / "compat.json")
    headprobe.allocate("headkv", [headprobe.Profile.load(R2)]).save(d / "map.json")
    duo = d / "noconfig"
    duo.mkdir()
    (duo / "full_attention_heads.tsv").write_text("\n".join("0.9\t0.1\t0.4" for _ in range(30)) + "\n")
    return {"list": str(d / "list.json"), "mystery": str(d / "mystery_heads.json"), "compat": str(d / "compat.json"),
            "map": str(d / "map.json"), "noconfig": str(duo), "out": str(d / "out.json")}


REFUSALS = [
    ([], "give a budget map, a profile, a DuoAttention folder or a HeadKV score file, or --press with --ratio"),
    ([R2, "--context", "0"], "--context 0: expected a whole number of tokens from 1"),
    ([R2, "--context", "100", "--dtype", "float64"], "--dtype float64: expected one of float32, bfloat16, float16"),
    ([R2, "--context", "100", "--batch", "0"], "--batch 0: expected a whole number of sequences from 1"),
    ([R2, "--context", "100", "--max-new-tokens", "0"], "--max-new-tokens 0: expected a whole number of tokens"),
    (["{map}", "--context", "100", "--sparsity", "0.5"],
     "--sparsity applies to a DuoAttention folder; the input is a budget map"),
    (["{map}", "--context", "100", "--gqa", "mean"], "--gqa applies to a HeadKV / Retrieval_Head score file"),
    ([R2, "--context", "100", "--ratio", "0.5"], "--ratio applies to a kvpress press or a DuoAttention folder"),
    (["--press", "snapkv", "--ratio", "1.5", "--context", "100"], "--ratio 1.5: expected kvpress' compression_ratio"),
    (["--press", "snapkv", "--context", "100"], "a kvpress press needs --ratio"),
    (["--press", "nosuch", "--ratio", "0.5", "--context", "100"], "--press nosuch: expected one of snapkv"),
    (["--press", "snapkv", "--ratio", "0.5", "--context", "100", "--press-option", "window=4"],
     "--press-option window=4: SnapKVPress has no option 'window'"),
    ([R2, "--press", "snapkv", "--ratio", "0.5", "--context", "100"], ("--press explains a kvpress press without an "
                                                                      "input file")),
    ([R2, "--context", "100", "--press-option", "n_sink=2"], "--press-option needs --press"),
    ([R2, "--context", "100", "--sparsity", "2"], "--sparsity 2.0: expected DuoAttention's share of streaming heads"),
    ([R2, "--context", "100", "--to", "budget"], "--to budget and -o FILE go together"),
    ([R2, "--context", "100", "-o", "{out}"], "--to budget and -o FILE go together"),
    ([R2, "--context", "100", "--json", "{out}", "--to", "budget", "-o", "{out}"],
     "--json, --plot and -o name the same file"),
    ([R2, "--context", "100", "--plot", "x.jpg"], "x.jpg: plot format must be one of png, svg"),
    (["{map}", "--context", "100", "--to", "budget", "-o", "{out}"], "is a budget map already"),
    ([R2, "--context", "100", "--policy", "keepkv"], ("policy 'keepkv': explain models the runtime's snapkv, "
                                                     "streaming and layer_window policies")),
    ([R2, "--context", "100", "--option", "window=4"], "--option needs --policy"),
    ([R2, "--context", "100", "--gqa", "max"], "--gqa max: expected one of mean, sum"),
    (["{list}", "--context", "100"], "expected a headprobe budget map, layer split or profile, a HeadKV / Retrieval_Head score file"),
    (["{mystery}", "--context", "100"], "cannot tell the model from the name 'mystery_heads'; pass --model"),
    (["{compat}", "--context", "100"], "a query-head budget map (allocated with --compat headkv)"),
    (["{map}", "--context", "100", "--model", "gemma3-270m"], "budget map"),
    (["{noconfig}", "--context", "100", "--model", "smollm2-135m"], "config.json gives no sink_size; pass --sink-size"),
    (["{noconfig}", "--context", "100", "--model", "smollm2-135m", "--sink-size", "4", "--recent-size", "0"],
     "--recent-size 0: expected a whole number of tokens from 1"),
    (["--press", "snapkv", "--ratio", "0.5", "--context", "100", "--model", "nosuchalias"],
     "--model nosuchalias: unknown model alias"),
    ([R2, "{map}", "--context", "100"], "give one input"),
    ([R2, "--context", "100", "--capacity", "4", "--window", "8"], "capacity 4 must be larger than the window"),
    (["{mystery}", "--context", "100", "--model", "smollm2-135m"], "holds 2 layers x 2 query heads"),
    ([R2, "--context", "100", "--beta", "1"], "beta must be a number larger than 1"),
]


@pytest.mark.parametrize("argv,message", REFUSALS, ids=[" ".join(a[:4]) + f" #{i}" for i, (a, _) in
                                                        enumerate(REFUSALS)])
def test_bad_input_is_refused_in_one_line_and_writes_nothing(argv, message, bad, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [a.format(**bad) for a in argv]
    if "--context" not in argv:
        argv += ["--context", "100"]
    code, out, err = _run(capsys, *argv)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("headprobe: error: "), err
    assert message in err, err
    assert not out
    assert not list(tmp_path.iterdir()) and not Path(bad["out"]).exists()


def test_context_is_required(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["explain", R2])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--context" in err


def test_gemma3_sliding_layers_keep_their_window_and_head_engines_do_not_run(capsys):
    code, out, _ = _run(capsys, GEMMA, "--context", "2048")
    assert code == 0
    assert out.count("(sliding)") == 15 and "   511" in out
    assert "HeadKV           cannot run: HeadKV patches Llama and Mistral models only" in out
