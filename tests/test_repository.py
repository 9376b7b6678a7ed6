"""The README, recipes and launch scripts stay in step with the code; the import rule
of docs/architecture.md holds."""

import ast
import glob
import os
import re
import subprocess

import tomllib

from conftest import ROOT
from paddle_resnet.cli import flag_table_markdown
from paddle_resnet.config import list_recipes


def test_readme_flag_table_is_the_generated_one():
    with open(os.path.join(ROOT, "README.md")) as handle:
        readme = handle.read()
    block = readme.split("<!-- flag-table:start")[1].split("-->", 1)[1]
    block = block.split("<!-- flag-table:end -->")[0].lstrip("\n")
    assert block == flag_table_markdown(), (
        "README flag table is stale: paste the output of python -m paddle_resnet.cli --flag-table"
    )


def tracked_python_files():
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [
        os.path.join(ROOT, path)
        for path in listed.stdout.split()
        if os.path.exists(os.path.join(ROOT, path))
    ]


def test_imports_are_at_the_top_of_every_module():
    """docs/architecture.md, the import rule: no import inside a function."""
    nested = []
    for path in tracked_python_files():
        with open(path) as handle:
            tree = ast.parse(handle.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                nested += [
                    f"{os.path.relpath(path, ROOT)}:{inner.lineno}"
                    for inner in ast.walk(node)
                    if isinstance(inner, (ast.Import, ast.ImportFrom))
                ]
    assert not nested, nested


ENTRY_POINTS = ("train", "export_model", "inference")


def top_level_imports(path):
    """The absolute module names ``path`` imports, anywhere in it."""
    with open(path) as handle:
        tree = ast.parse(handle.read())
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_nothing_imports_the_entry_points():
    """train.py, export_model.py and inference.py are run, never imported: tests and
    scripts reach the same code in paddle_resnet.commands."""
    importers = [
        f"{os.path.relpath(path, ROOT)}: {name}"
        for path in tracked_python_files()
        for name in top_level_imports(path)
        if name.split(".")[0] in ENTRY_POINTS + ("program",)
    ]
    assert not importers, importers


def test_entry_points_only_call_their_command():
    """Each top-level tool is its docstring, one import and one call: the library code
    lives in the package, and only ``paddle_resnet`` is installed."""
    for name in ENTRY_POINTS:
        path = os.path.join(ROOT, f"{name}.py")
        assert top_level_imports(path) == ["sys", "paddle_resnet.commands"], path
        with open(path) as handle:
            body = ast.parse(handle.read()).body
        assert [type(node) for node in body] == [ast.Expr, ast.Import, ast.ImportFrom, ast.If]
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        project = tomllib.load(handle)
    assert "py-modules" not in project["tool"].get("setuptools", {})
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["paddle_resnet*"]
    for target in project["project"]["scripts"].values():
        module, _, function = target.partition(":")
        assert function == "main" and os.path.exists(
            os.path.join(ROOT, *module.split(".")) + ".py"
        ), target


def test_shell_scripts_parse_and_name_real_recipes():
    scripts = glob.glob(os.path.join(ROOT, "scripts", "**", "*.sh"), recursive=True)
    assert len(scripts) > 20
    recipes = set(list_recipes())
    for script in scripts + [os.path.join(ROOT, ".ci", "run")]:
        subprocess.run(["bash", "-n", script], check=True)
        with open(script) as handle:
            text = handle.read()
        for name in re.findall(r'launch\.sh" (\S+) ', text):
            assert name in recipes, (script, name)


def test_launch_script_rejects_bad_arguments():
    launch = os.path.join(ROOT, "scripts", "training", "launch.sh")
    result = subprocess.run(
        ["bash", launch, "resnet50_paddle_90e", "8", "FP8"], capture_output=True, text=True
    )
    assert result.returncode == 2 and "PRECISION must be AMP or TF32" in result.stderr
