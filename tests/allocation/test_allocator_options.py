"""Allocator options: one dataclass per method, checked like policy options, recorded in every map, and
the only place a new option or a new method is declared (the command line and eval settings follow)."""

from __future__ import annotations

import dataclasses
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from conftest import SMOLLM2_IDENTITY

from headprobe.allocation.api import allocate
from headprobe.allocation.options import AllocatorOptions, CapacityOptions
from headprobe.allocation.pyramid import DEFAULT_TAPER
from headprobe.allocation.registry import ALLOCATORS, option_infos
from headprobe.errors import HeadprobeError, flag_spelling
from headprobe.profile import LayerRetention, Profile, reduce_groups

SMOL = dataclasses.replace(SMOLLM2_IDENTITY, max_context=8192)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "allocation.md"

#: A value other than the default for every option the shipped allocators declare, and what the map records.
NON_DEFAULT = {"beta": (1.5, 1.5), "temperature": (0.5, 0.5), "reduction": ("max", "max"),
               "compat": ("headkv", "headkv"), "task": ("code", {"code": 1.0}), "taper": (5, 5.0),
               "allow_fallback": (True, None), "engine": ("tensorrt-llm", "tensorrt-llm"),
               "global_layers": (2, 2), "cache_bytes": ("100MB", "100MB"), "cache_share": ("30%", "30%"), "layer_score": ("mean", "mean"),
               "seed": (1, 1)}


def head_profile() -> Profile:
    q = (np.random.default_rng(0).random((30, 9)) ** 3).tolist()
    return Profile(kind="retrieval_reasoning", model=SMOL, probe={}, trials={"total": 4, "passed": 4},
                   query_heads=q, kv_heads=reduce_groups(q, 3, "mean"))


def retention_profile() -> Profile:
    m = (np.arange(30) + 1.0) / np.sum(np.arange(30) + 1.0)
    return Profile(kind="layer_retention", model=SMOL, probe={}, trials={"total": 2, "passed": 2},
                   retention={t: LayerRetention(mean=m.tolist(), std=[0.0] * 30, samples=2)
                              for t in ("code", "single_doc_qa")})


def _profiles(allocator):
    made = {"head_scores": head_profile(), "layer_retention": retention_profile()}
    return [made[n] for n in allocator.needs]


# ---- every option is recorded in the map ---------------------------------------------------------------------

@pytest.mark.parametrize("method", sorted(ALLOCATORS))
def test_every_option_of_every_method_is_recorded_in_its_map(method):
    allocator = ALLOCATORS[method]
    infos = allocator.options.infos()
    default = allocate(method, _profiles(allocator), model=SMOL)
    for info in infos:
        assert info.record in default.method, (method, info.name)
        value, recorded = NON_DEFAULT[info.name]
        bm = allocate(method, _profiles(allocator), model=SMOL, **{info.name: value})
        assert bm.method[info.record] == recorded, (method, info.name)


def test_one_option_name_means_one_option_in_every_method():
    """beta is HeadKV's β wherever it is read; PyramidKV's slope has its own name."""
    by_name: dict[str, list] = {}
    for allocator in ALLOCATORS.values():
        for info in allocator.options.infos():
            by_name.setdefault(info.name, []).append(info)
    for name, infos in by_name.items():
        assert all(i == infos[0] for i in infos), name
    assert "beta" not in ALLOCATORS["pyramid"].options.names()
    assert ALLOCATORS["pyramid"].options.names() == ("taper",)
    assert not set(CapacityOptions.names()) & set(option_infos())


def test_pyramid_taper_is_pyramidkvs_beta_and_is_recorded_as_such():
    default = allocate("pyramid", model=SMOL, capacity=64)
    assert allocate("pyramid", model=SMOL, capacity=64, taper=DEFAULT_TAPER).budgets == default.budgets
    assert default.method["beta"] == 20.0
    steep = allocate("pyramid", model=SMOL, capacity=64, taper=5)
    b = np.asarray(steep.budgets)
    base = 64 - 8                              # PyramidKV: the last layer keeps b / taper, the first 2b - b / taper
    assert b[-1].mean() - 8 == pytest.approx(base / 5, abs=1) and b[0].mean() - 8 == pytest.approx(2 * base - base / 5,
                                                                                                  abs=1)
    assert steep.method["beta"] == 5.0 and int(b.sum()) == 64 * 90
    with pytest.raises(HeadprobeError, match=r"taper=1: expected a number larger than 1"):
        allocate("pyramid", model=SMOL, taper=1)


# ---- options that do not apply, and bad values -----------------------------------------------------------------

@pytest.mark.parametrize("method, options, message", [
    ("headkv", {"task": "code"}, "task='code': does not apply to method headkv (read by dynamickv, combined, layer_split;"),
    ("pyramid", {"beta": 20}, ("beta=20: does not apply to method pyramid (read by headkv, combined; pyramid's "
                              "options: taper)")),
    ("uniform", {"temperature": 2.0}, "temperature=2.0: does not apply to method uniform"),
    ("combined", {"compat": "headkv"}, "compat='headkv': does not apply to method combined (read by headkv;"),
    ("dynamickv", {"bonus": 1}, "bonus=1: no such option of method dynamickv (its options: task)"),
])
def test_an_option_the_method_does_not_read_is_refused_naming_who_reads_it(method, options, message):
    allocator = ALLOCATORS[method]
    with pytest.raises(HeadprobeError) as info:
        allocate(method, _profiles(allocator), model=SMOL, **options)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("options, message", [
    ({"beta": "big"}, "beta='big': expected a number"),
    ({"beta": True}, "beta=True: expected a number"),
    ({"temperature": 0}, "temperature=0: expected a positive finite number"),
    ({"reduction": "median"}, "reduction must be one of mean, max, sum, got 'median'"),
    ({"allow_fallback": "yes"}, "allow_fallback='yes': expected true or false"),
    ({"compat": "pyramidkv"}, "compat must be one of headkv, got 'pyramidkv'"),
])
def test_bad_option_values_are_one_line_refusals(options, message):
    with pytest.raises(HeadprobeError) as info:
        allocate("headkv", [head_profile()], **options)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_refusals_name_options_as_the_command_line_spells_them():
    with flag_spelling({"allow_fallback": "--fallback-uniform"}), pytest.raises(HeadprobeError) as info:
        allocate("pyramid", model=SMOL, allow_fallback=True)
    assert str(info.value).startswith("--fallback-uniform: does not apply to method pyramid")


def test_a_task_mix_with_a_bad_weight_is_refused_before_any_profile_is_read():
    with pytest.raises(HeadprobeError, match="task mix 'code:x': weight 'x'"):
        allocate("dynamickv", [], model=SMOL, task="code:x")


# ---- a new allocator: one file and one registry line -------------------------------------------------------

@pytest.fixture
def toy(monkeypatch):
    """The smallest allocator, as docs/allocation.md shows it (its code block ``headprobe/allocation/toy.py``),
    registered for the test only."""
    text = DOCS.read_text(encoding="utf-8")
    code = re.search(r"```python\n(# headprobe/allocation/toy\.py.*?)```", text, re.DOTALL).group(1)
    module = types.ModuleType("headprobe.allocation.toy")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(code, str(DOCS), "exec"), module.__dict__)  # noqa: S102 - the documented example, run as written
    monkeypatch.setitem(ALLOCATORS, module.ALLOCATOR.name, module.ALLOCATOR)
    return module.ALLOCATOR


def test_a_registered_allocator_runs_by_name_with_its_options(toy):
    bm = allocate("toy", model=SMOL, capacity=64, bonus=4)
    b = np.asarray(bm.budgets)
    assert bm.method["allocator"] == "toy" and bm.method["bonus"] == 4
    assert int(b.sum()) == 64 * 90 and b[0].min() > b[-1].max()
    assert allocate("toy", model=SMOL, capacity=64).budgets == allocate("uniform", model=SMOL, capacity=64).budgets
    with pytest.raises(HeadprobeError, match="bonus=-1: expected at least 0"):
        allocate("toy", model=SMOL, bonus=-1)
    with pytest.raises(HeadprobeError, match="bonus=2: does not apply to method uniform .read by toy"):
        allocate("uniform", model=SMOL, bonus=2)
    assert issubclass(toy.options, AllocatorOptions)
    from headprobe.tune.space import SearchSpace

    assert "toy" in SearchSpace().allocations          # tune's default space: every registered method


def test_a_registered_allocator_gets_its_flag_and_its_setting_options(toy, tmp_path, monkeypatch, capsys):
    from headprobe_cli.main import main

    from headprobe.eval.settings import EvalSetting, expand_settings

    monkeypatch.chdir(tmp_path)
    head_profile().save(tmp_path / "p.json")     # gives the model; the toy reads no profile
    assert main(["allocate", "--method", "toy", "--profile", "p.json", "--capacity", "64", "--bonus", "3",
                 "-o", "t.json"]) == 0
    assert "toy (capacity 64" in capsys.readouterr().out
    assert main(["allocate", "--profile", "p.json", "--bonus", "3", "-o", "h.json"]) == 2
    assert "--bonus 3: does not apply to method headkv (read by toy;" in capsys.readouterr().err
    setting, = expand_settings(["snapkv:toy[bonus=3,window=16]"], [64])
    assert setting.allocation_options == {"bonus": 3} and setting.options == {"window": 16}
    assert EvalSetting.parse(setting.label) == setting


def test_numpy_numbers_are_options_and_capacities_as_before():
    bm = allocate("pyramid", model=SMOL, capacity=np.int64(64), window=np.int64(8), taper=np.float32(20))
    assert bm.budgets == allocate("pyramid", model=SMOL, capacity=64).budgets and bm.method["capacity"] == 64
    assert allocate("headkv", [head_profile()], beta=np.float64(1.5), reduction=None).method["beta"] == 1.5
    with pytest.raises(HeadprobeError, match=r"capacity=64.0: expected a whole number of tokens from 1 to"):
        allocate("uniform", model=SMOL, capacity=64.0)
