"""The command line starts without torch, transformers or matplotlib; it reaches the library only through
the public API of ``headprobe``, every name of which resolves to the module that defines it."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from headprobe_cli.main import COMMAND_MODULES, build_parser, main

import headprobe

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "matplotlib", "seaborn", "pandas", "scipy")


def _imported_after(code: str) -> dict[str, bool]:
    """Which heavy packages are in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")])}
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("code", [
    "import headprobe",
    "from headprobe_cli.main import build_parser\nbuild_parser()",
    ("import contextlib, io\nfrom headprobe_cli.main import main\n"
     "with contextlib.redirect_stdout(io.StringIO()):\n    assert main(['models']) == 0"),
    ("import contextlib, io\nfrom headprobe_cli.main import main\n"
     "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n    main(['--help'])"),
])
def test_parser_help_and_models_import_nothing_heavy(code):
    loaded = _imported_after(code)
    assert not any(loaded[m] for m in ("torch", "transformers", "matplotlib")), loaded


def test_a_command_that_needs_torch_still_gets_it():
    # the lazy names load their modules when used: a policy class is a torch module's
    assert _imported_after("import headprobe\nheadprobe.POLICIES")["torch"]


def _public_targets() -> dict[str, str]:
    return {name: target for stage in headprobe._API.values() for name, target in stage.items()}


def test_every_public_name_resolves_to_the_module_that_defines_it():
    names = [n for stage in headprobe._API.values() for n in stage]
    assert len(names) == len(set(names)), "a name is listed in two stages"
    assert headprobe.__all__ == sorted([*names, "__version__"])
    assert dir(headprobe) == headprobe.__all__
    for name, target in _public_targets().items():
        module_name, _, attribute = target.partition(":")
        module = importlib.import_module(f"headprobe.{module_name}")
        value = getattr(headprobe, name)
        expected = getattr(module, attribute or name, None)
        if expected is None:   # a submodule under a public name (probe_grid)
            expected = importlib.import_module(f"{module.__name__}.{attribute}")
        assert value is expected, name
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__ == module.__name__, f"{name} is defined in {value.__module__}, not {target}"


def test_public_names_do_not_shadow_submodules_and_unknown_names_fail():
    submodules = {p.stem for p in (ROOT / "headprobe").iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert not submodules & set(headprobe.__all__)
    assert headprobe.paths.shipped_profiles_dir().is_dir()   # submodules still resolve as attributes
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        headprobe.nosuch  # noqa: B018


def test_the_command_line_uses_only_the_public_api():
    for path in sorted((ROOT / "cli" / "headprobe_cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                assert not node.module.startswith("headprobe."), f"{path.name}: from {node.module} import ..."
                if node.module == "headprobe":
                    assert all(a.name in headprobe.__all__ for a in node.names), path.name
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("headprobe.") for a in node.names), path.name
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in ("headprobe", "hp") and not node.attr.startswith("__"):
                assert node.attr in headprobe.__all__, f"{path.name}: headprobe.{node.attr} is not public"


def test_profile_help_lists_the_probes_by_their_profile_kinds():
    # ``profile --help`` names the probes through PROFILE_KINDS, which needs no torch
    assert tuple(headprobe.PROBES) == tuple(headprobe.PROFILE_KINDS)


@pytest.mark.parametrize("command", ["profile", "eval", "ablate", "generate"])
def test_commands_that_load_a_model_share_its_arguments(command):
    parser = build_parser()
    args = parser.parse_args([command, "--model", "x", "--device", "cpu", "--dtype", "bfloat16",
                              "--trust-remote-code"])
    assert (args.model, args.device, args.dtype, args.trust_remote_code) == ("x", "cpu", "bfloat16", True)
    with pytest.raises(SystemExit):
        parser.parse_args([command, "--dtype", "float64"])
    assert parser.parse_args([command]).dtype == "auto"


def test_resume_and_force_mean_the_same_everywhere():
    parser = build_parser()
    for command in ("profile", "eval", "ablate"):
        args = parser.parse_args([command, "--resume", "--force"])
        assert args.resume and args.force
    for command, extra in [("allocate", []), ("export", ["x.json", "--to", "layers", "-o", "y"]),
                           ("import", ["x.json"]), ("plot", ["x.json"])]:
        assert parser.parse_args([command, *extra, "--force"]).force


def test_allocate_help_lists_every_allocator(capsys):
    with pytest.raises(SystemExit):
        main(["allocate", "--help"])
    out = capsys.readouterr().out
    for allocator in headprobe.ALLOCATORS.values():
        assert f"{allocator.name:<10} {allocator.description}" in out


def test_generate_checks_and_lists_policies_from_the_runtime(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert ", ".join(sorted(headprobe.POLICIES)) in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        main(["generate", "--policy", "nosuch", "hello"])
    assert "invalid choice: 'nosuch'" in capsys.readouterr().err


def test_every_command_module_is_registered():
    found = {p.stem[4:] for p in (ROOT / "cli" / "headprobe_cli").glob("cmd_*.py")}
    assert found == set(COMMAND_MODULES)
