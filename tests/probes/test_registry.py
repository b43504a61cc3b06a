"""Probe passes come from one registry: every list of probes and profile kinds is derived from it, and a pass
registered from outside the package (here, inside this test only) runs end to end through ``run_profile``
and ``headprobe profile``, reading its own input (a user's examples: no haystack, no needle) and writing a
profile."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from headprobe_cli.main import main

import headprobe
from headprobe import HeadprobeError, Profile, ProfileRequest, run_profile
from headprobe.attention.recorder import RowRecorder, RowRequest
from headprobe.haystack.context import render_prompt
from headprobe.models import loading
from headprobe.models.identity import ModelIdentity
from headprobe.probes import registry
from headprobe.probes.pass_steps import PassSteps
from headprobe.probes.plan import check_profile_run
from headprobe.probes.trial_grid import shard_samples
from headprobe.profile import reduce_groups

torch.set_num_threads(1)


# ---- the toy pass: each head's attention from the last prompt token to the first ---------------------

@dataclass(frozen=True)
class Example:
    id: str
    context: str
    question: str


@dataclass
class SinkOptions:
    examples: Path


@torch.no_grad()
def sink_trial(loaded, example: Example, chat_template: bool) -> dict:
    """One example's record: ``scores[layer][head]``, the attention of its last prompt token to its first."""
    text, _, special = render_prompt(loaded.tokenizer, f"{example.context}\n\n{example.question}", chat_template)
    ids = loaded.tokenizer(text, add_special_tokens=special)["input_ids"]
    scores: dict[int, list[float]] = {}

    def keep(layer: int, rows: torch.Tensor, key_positions: torch.Tensor) -> None:   # [1, heads, 1, keys]
        scores[layer] = [float(rows[0, h, 0, int((key_positions == 0).nonzero()[0, 0])])
                         for h in range(rows.shape[1])]

    with RowRecorder(loaded.model) as rec:
        rec.request = RowRequest(torch.tensor([[len(ids) - 1]]), 0, keep)
        loaded.model(input_ids=torch.tensor([ids]), logits_to_keep=1)
    return {"trial": example.id, "prompt_tokens": len(ids), "scores": [scores[layer] for layer in sorted(scores)]}


class SinkPass(PassSteps):
    kinds = ("toy_sink",)
    runners: ClassVar = {"fast": sink_trial}
    options = SinkOptions

    def read(self, request, options, inputs):
        lines = [json.loads(line) for line in Path(options.examples).read_text().splitlines() if line.strip()]
        if not lines:
            raise HeadprobeError(f"{options.examples}: no examples")
        return tuple(Example(f"e{i}", x["context"], x["question"]) for i, x in enumerate(lines))

    def settings(self, loaded, plan, context):
        return {**context.common, "pass": plan.probe_pass.name, "probes": list(plan.probes),
                "examples": len(plan.data), "shard": list(context.request.shard or []) or None}

    def trials(self, run):
        return shard_samples(list(run.plan.data), run.request.shard)

    def run(self, loaded, run, todo, log, progress):
        for example in todo:
            log.append(self.runner(run.request.mode)(loaded, example, run.request.chat_template))
            if progress:
                progress(1)

    def profiles(self, settings, records):
        identity = ModelIdentity.from_json(settings["model"])
        layers, heads = identity.num_layers, identity.num_query_heads
        mean = [[math.fsum(r["scores"][l][h] for r in records) / len(records) for h in range(heads)]
                for l in range(layers)]
        probe = {**{k: v for k, v in settings.items() if k != "probes"}, "kind": "toy_sink"}
        return [Profile(kind="toy_sink", model=identity, probe=probe, trials={"total": len(records),
                                                                               "passed": len(records)},
                        query_heads=mean, kv_heads=reduce_groups(mean, identity.group_size))]


SINK = registry.ProbePass("sink", ("toy_sink",), "head_scores", SinkPass(), "attention to the first token")


@pytest.fixture
def sink_pass():
    registry.register_pass(SINK)
    try:
        yield SINK
    finally:
        registry.unregister_pass("sink")


@pytest.fixture
def examples(tmp_path) -> Path:
    path = tmp_path / "examples.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in [
        {"context": "Ana keeps her bicycle in the red shed behind the school.", "question": "Where is the bicycle?",
         "answer": "in the red shed"},
        {"context": "The meeting moved from Tuesday to Thursday at noon.", "question": "When is the meeting?",
         "answer": "Thursday at noon"},
        {"context": "Bo planted tomatoes, beans and one pumpkin this spring.", "question": "What did Bo plant once?",
         "answer": "one pumpkin"}]))
    return path


# ---- derived lists ----------------------------------------------------------------------------------

def kinds_of(passes, holds: str | None = None) -> tuple[str, ...]:
    """The profile kinds of ``passes``, in order (only those whose profiles hold ``holds``)."""
    return tuple(k for p in passes if holds is None or p.holds == holds for k in p.kinds)


def test_every_list_of_kinds_comes_from_the_registry(sink_pass):
    from headprobe_cli.main import build_parser

    from headprobe.allocation.registry import NEEDS
    from headprobe.eval.settings import PROFILE_KINDS as eval_kinds
    from headprobe.profile_kinds import PROFILE_KINDS as file_kinds

    passes = registry.probe_passes()
    assert passes[-1] is sink_pass and kinds_of(passes)[-1] == "toy_sink"
    for kinds in (headprobe.PROBES, headprobe.PROFILE_KINDS, file_kinds, eval_kinds):
        assert tuple(kinds) == kinds_of(passes)
    assert registry.pass_of_kind("toy_sink") is sink_pass
    head_kinds = kinds_of(passes, "head_scores")
    assert tuple(headprobe.HEAD_SCORE_KINDS) == head_kinds and "toy_sink" in head_kinds
    assert all(k in NEEDS["head_scores"].words for k in head_kinds)       # an allocator's "needs" message
    assert build_parser().parse_args(["import", "scores.json", "--kind", "toy_sink"]).kind == "toy_sink"


def test_the_built_in_passes_and_their_steps_agree():
    assert tuple(headprobe.PROFILE_KINDS) == kinds_of(registry.BUILTIN_PASSES)
    for probe_pass in registry.probe_passes():
        assert probe_pass.implementation.kinds == probe_pass.kinds, probe_pass.name
        modes = probe_pass.implementation.modes        # the user's contexts have no haystack to reuse
        assert modes == (("fast", "reference") if probe_pass.name == "contexts" else tuple(headprobe.MODES))
    from headprobe.allocation.registry import NEEDS
    head_kinds = kinds_of(registry.BUILTIN_PASSES, "head_scores")
    assert NEEDS["head_scores"].words == f"a head-score profile ({', '.join(head_kinds[:-1])} or {head_kinds[-1]})"


def test_a_pass_is_registered_once_and_a_kind_belongs_to_one_pass(sink_pass):
    with pytest.raises(ValueError, match="already registered"):
        registry.register_pass(SINK)
    with pytest.raises(ValueError, match="retrieval are taken"):
        registry.register_pass(registry.ProbePass("other", ("retrieval",), "head_scores", SinkPass()))
    with pytest.raises(ValueError, match="holds 'scores'"):
        registry.register_pass(registry.ProbePass("other", ("other",), "scores", SinkPass()))


# ---- a pass from outside the package, end to end ------------------------------------------------

def test_a_registered_pass_runs_through_run_profile(sink_pass, examples, tiny_llama, tmp_path):
    request = ProfileRequest(probes=["toy_sink"], out_dir=tmp_path, chat_template=False,
                             options={"sink": {"examples": examples}})
    result = run_profile(tiny_llama, request)
    assert result.logs == [tmp_path / "tiny-llama.sink.trials.jsonl"] and result.trials_run == 3
    assert result.profiles == [tmp_path / "tiny-llama.toy_sink.json"]
    records = [json.loads(line) for line in result.logs[0].read_text().splitlines()[1:]]
    profile = Profile.load(result.profiles[0])
    assert profile.kind == "toy_sink" and profile.probe["pass"] == "sink" and profile.probe["examples"] == 3
    layers, heads = tiny_llama.identity.num_layers, tiny_llama.identity.num_query_heads
    assert profile.query_heads == [[math.fsum(r["scores"][l][h] for r in records) / 3 for h in range(heads)]
                                   for l in range(layers)]
    assert all(0 < x <= 1 for r in records for row in r["scores"] for x in row)   # softmax weights
    # it resumes like any pass: nothing left to run, the profile rewritten from its own log
    again = run_profile(tiny_llama, ProfileRequest(**{**request.__dict__, "resume": True}))
    assert (again.trials_run, again.trials_skipped) == (0, 3)
    assert Profile.load(again.profiles[0]).query_heads == profile.query_heads


def test_a_registered_pass_runs_through_the_command(sink_pass, examples, tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["profile", "--model", str(tiny_dir), "--device", "cpu", "--probe", "toy_sink", "--no-chat-template",
            "--out-dir", str(out), "--pass-option", f"sink.examples={examples}"]
    assert main(argv) == 0
    assert (out / "tiny.toy_sink.json").exists() and (out / "tiny.sink.trials.jsonl").exists()
    assert f"wrote {out / 'tiny.toy_sink.json'} (3/3 trials passed)" in capsys.readouterr().out
    assert Profile.load(out / "tiny.toy_sink.json").trials == {"total": 3, "passed": 3}


@pytest.mark.parametrize(("extra", "message"), [
    (["--mode", "reference"], "--mode reference: the sink pass runs in fast mode only"),
    ([], "--pass-option sink.examples: required by the sink pass"),
    (["--pass-option", "sink.nosuch=1"], "--pass-option sink.nosuch: no such option of the sink pass"),
    (["--pass-option", "sink"], "--pass-option sink: expected PASS.FIELD=VALUE"),
    (["--pass-option", "retrieval.x=1"], "--pass-option retrieval: no requested pass of that name"),
])
def test_a_registered_pass_is_checked_before_the_model_loads(sink_pass, tiny_dir, tmp_path, monkeypatch, capsys,
                                                             extra, message):
    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(loading, "load_model", load_model)
    assert main(["profile", "--model", str(tiny_dir), "--probe", "toy_sink", "--out-dir", str(tmp_path), *extra]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("headprobe: error:")]
    assert len(err) == 1 and message in err[0], err


def test_an_unregistered_pass_is_gone(examples, tmp_path, capsys):
    assert "toy_sink" not in headprobe.PROBES
    for argv in (["profile", "--probe", "toy_sink"], ["import", "scores.json", "--kind", "toy_sink"]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "invalid choice: 'toy_sink'" in capsys.readouterr().err
    with pytest.raises(HeadprobeError, match="probes='toy_sink': unknown probe"):
        check_profile_run(ProfileRequest(probes=["toy_sink"], out_dir=tmp_path), "tiny")


def test_options_are_typed_from_text(sink_pass, examples, tmp_path):
    plan = check_profile_run(ProfileRequest(probes=["toy_sink"], out_dir=tmp_path,
                                            options={"sink": {"examples": str(examples)}}), "tiny")
    assert plan.passes[0].options == SinkOptions(examples=examples) and len(plan.passes[0].data) == 3
    with pytest.raises(HeadprobeError, match="options='retrieval': the retrieval pass takes no options"):
        check_profile_run(ProfileRequest(probes=["retrieval"], out_dir=tmp_path, options={"retrieval": {"x": 1}}),
                          "tiny")


# ---- the example of docs/profiling.md ---------------------------------------------------------------

def _documented_pass() -> tuple[str, str]:
    """The new file and the registry line of "Adding a probe pass" in docs/profiling.md."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "profiling.md").read_text()
    section = text.split("## Adding a probe pass", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]
    assert len(blocks) == 2, "the section shows the new file and the registry line"
    return blocks[0], blocks[1].strip().rstrip(",")


def test_the_documented_pass_runs(tiny_llama, tmp_path, monkeypatch):
    import ast
    import importlib.util
    import sys

    code, line = _documented_pass()
    (tmp_path / "sink_pass.py").write_text(code)            # the new file, as a module of headprobe.probes
    spec = importlib.util.spec_from_file_location("headprobe.probes.sink_pass", tmp_path / "sink_pass.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "headprobe.probes.sink_pass", module)
    spec.loader.exec_module(module)
    call = ast.parse(line, mode="eval").body                  # the registry line
    assert isinstance(call, ast.Call) and call.func.id == "ProbePass"
    probe_pass = registry.ProbePass(*[ast.literal_eval(arg) for arg in call.args])
    registry.register_pass(probe_pass)
    try:
        request = ProfileRequest(probes=["attention_sink"], out_dir=tmp_path, chat_template=False,
                                 tasks=["single_doc_qa", "code"], samples_per_task=1)
        result = run_profile(tiny_llama, request)
        profile = Profile.load(result.profiles[0])
    finally:
        registry.unregister_pass(probe_pass.name)
    assert result.profiles == [tmp_path / "tiny-llama.attention_sink.json"] and result.trials_run == 2
    records = [json.loads(line) for line in (tmp_path / "tiny-llama.sink.trials.jsonl").read_text().splitlines()[1:]]
    assert profile.query_heads == [[(records[0]["scores"][l][h] + records[1]["scores"][l][h]) / 2
                                    for h in range(tiny_llama.identity.num_query_heads)]
                                   for l in range(tiny_llama.identity.num_layers)]
    assert "attention_sink" not in headprobe.PROFILE_KINDS


def test_option_values_given_as_text_are_converted_or_refused():
    from headprobe.probes.pass_options import build_options

    @dataclass
    class Options:
        count: int
        share: float = 0.5
        path: Path | None = None
        strict: bool = False

    built = build_options("p", Options, {"count": "3", "share": "1", "path": "a/b", "strict": "yes"})
    assert built == Options(count=3, share=1.0, path=Path("a/b"), strict=True)
    assert build_options("p", Options, {"count": 2, "share": 1}) == Options(count=2, share=1.0)
    for values, message in [({"count": "x"}, "options='p.count': expected int, found 'x'"),
                            ({"count": True}, "options='p.count': expected int, found True"),
                            ({"count": 1, "strict": "maybe"}, "options='p.strict': expected bool, found 'maybe'")]:
        with pytest.raises(HeadprobeError, match=message.replace("(", r"\(")):
            build_options("p", Options, values)
