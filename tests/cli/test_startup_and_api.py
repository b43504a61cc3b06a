"""The command line starts without torch, transformers or matplotlib; it reaches the library only through
the public API of ``headprobe`` and the front-end helpers of ``headprobe.frontend``, every name of which
resolves to the module that defines it (the command line imports each from there: test_cli_imports.py)."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from headprobe_cli.main import COMMANDS, build_parser, main

import headprobe
import headprobe.frontend

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


def _targets(table: dict[str, dict[str, str]]) -> dict[str, str]:
    return {name: target for group in table.values() for name, target in group.items()}


def _check_resolves(namespace, table: dict[str, dict[str, str]], eager: tuple[str, ...] = ()) -> None:
    names = [n for group in table.values() for n in group]
    assert len(names) == len(set(names)), "a name is listed in two groups"
    assert namespace.__all__ == sorted([*names, *eager])
    assert dir(namespace) == namespace.__all__
    for name, target in _targets(table).items():
        module_name, _, attribute = target.partition(":")
        module = importlib.import_module(f"headprobe.{module_name}")
        value = getattr(namespace, name)
        expected = getattr(module, attribute or name, None)
        if expected is None:   # a submodule under its own name (trial_grid)
            expected = importlib.import_module(f"{module.__name__}.{attribute or name}")
        assert value is expected, name
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__ == module.__name__, f"{name} is defined in {value.__module__}, not {target}"


def test_every_public_name_resolves_to_the_module_that_defines_it():
    _check_resolves(headprobe, headprobe._API, eager=("__version__",))


def test_every_frontend_name_resolves_and_none_is_also_public():
    _check_resolves(headprobe.frontend, headprobe.frontend._FRONTEND)
    assert not set(headprobe.frontend.__all__) & set(headprobe.__all__)
    assert "check_overwrite" not in dir(headprobe) and "flag_spelling" not in dir(headprobe)
    with pytest.raises(AttributeError, match="no attribute 'run_profile'"):
        headprobe.frontend.run_profile  # noqa: B018


def test_public_names_do_not_shadow_submodules_and_unknown_names_fail():
    submodules = {p.stem for p in (ROOT / "headprobe").iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert not submodules & set(headprobe.__all__)
    assert headprobe.paths.shipped_profiles_dir().is_dir()   # submodules still resolve as attributes
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        headprobe.nosuch  # noqa: B018


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
    assert found == set(COMMANDS)


def _command_modules_after(code: str) -> list[str]:
    probe = (f"{code}\nimport json, sys\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.startswith('headprobe_cli.cmd_') "
             "or m in ('numpy', 'tqdm'))))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")])}
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_help_lists_every_command_and_a_command_line_imports_only_its_own_module(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out
    for name, summary in COMMANDS.items():
        assert f"{name}" in listed and summary in " ".join(listed.split())
    quiet = "import contextlib, io\nfrom headprobe_cli.main import main\n"
    assert _command_modules_after(
        quiet + "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
                "    main(['--help'])") == []    # nor numpy nor tqdm: no command's options are built
    assert _command_modules_after(
        quiet + "with contextlib.redirect_stdout(io.StringIO()):\n    main(['--debug', 'models'])") == [
        "headprobe_cli.cmd_models"]
    assert _command_modules_after(
        quiet + "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
                "    main(['profile', '--help'])") == ["headprobe_cli.cmd_profile", "numpy", "tqdm"]


def test_a_command_parsed_alone_equals_the_same_command_in_the_whole_parser():
    for name in COMMANDS:
        alone = build_parser(only=name)._subparsers._group_actions[0].choices[name]
        whole = build_parser()._subparsers._group_actions[0].choices[name]
        assert alone.format_help() == whole.format_help(), name


@pytest.mark.parametrize("command", ["inspect", "export", "explain", "tune", "ablate"])
def test_the_help_of_a_command_that_lists_no_library_values_loads_no_numpy(command):
    # these commands' options name no profile kind, policy or allocator, so their help needs no NumPy; the
    # library names they import at module level must not pull it in (it costs about 0.1 s a command line)
    quiet = "import contextlib, io\nfrom headprobe_cli.main import main\n"
    loaded = _command_modules_after(
        quiet + "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
                f"    main([{command!r}, '--help'])")
    assert f"headprobe_cli.cmd_{command}" in loaded and "numpy" not in loaded


#: The one package whose ``__init__`` holds something of its own: the policy registry.
REGISTRY_PACKAGES = {"headprobe/runtime/policies/__init__.py"}


def test_the_public_api_is_listed_once():
    # a subpackage re-exporting names would be a second list of the API, out of step with headprobe._API
    # sooner or later; a package's __init__ says what the package holds and defines nothing
    import ast

    inits = sorted(p for p in (ROOT / "headprobe").rglob("__init__.py") if p != ROOT / "headprobe" / "__init__.py")
    assert inits
    copies = []
    for path in inits:
        body = ast.parse(path.read_text()).body
        if str(path.relative_to(ROOT)) in REGISTRY_PACKAGES:
            continue
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        if body:
            copies.append(str(path.relative_to(ROOT)))
    assert copies == []
