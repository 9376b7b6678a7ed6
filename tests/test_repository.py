"""The README, recipes and launch scripts stay in step with the code; the import rule
of docs/architecture.md holds."""
import ast
import glob
import os
import re
import subprocess
import tomllib

from conftest import ROOT
from paddle_resnet.config import flag_table_markdown, list_recipes


def test_readme_flag_table_is_the_generated_one():
    with open(os.path.join(ROOT, "README.md")) as handle:
        readme = handle.read()
    block = readme.split("<!-- flag-table:start")[1].split("-->", 1)[1]
    block = block.split("<!-- flag-table:end -->")[0].lstrip("\n")
    assert block == flag_table_markdown(), (
        "README flag table is stale: paste the output of python -m paddle_resnet.config --flag-table")


def tracked_python_files():
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                             "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [os.path.join(ROOT, path) for path in listed.stdout.split()
            if os.path.exists(os.path.join(ROOT, path))]


def test_imports_are_at_the_top_of_every_module():
    """docs/architecture.md, the import rule: no import inside a function."""
    nested = []
    for path in tracked_python_files():
        with open(path) as handle:
            tree = ast.parse(handle.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                nested += [f"{os.path.relpath(path, ROOT)}:{inner.lineno}"
                           for inner in ast.walk(node)
                           if isinstance(inner, (ast.Import, ast.ImportFrom))]
    assert not nested, nested


def test_the_package_never_imports_the_entry_points():
    entry_points = {"program", "train", "export_model", "inference"}
    for path in glob.glob(os.path.join(ROOT, "paddle_resnet", "**", "*.py"), recursive=True):
        with open(path) as handle:
            tree = ast.parse(handle.read())
        for node in ast.walk(tree):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            assert not entry_points & {name.split(".")[0] for name in names if name}, path


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
    result = subprocess.run(["bash", launch, "resnet50_paddle_90e", "8", "FP8"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "PRECISION must be AMP or TF32" in result.stderr


def test_no_scripts_folder_shadows_an_entry_point():
    """A script's own folder comes first on sys.path: a folder scripts/inference/ made
    ``import inference`` in scripts/*.py an empty namespace package."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        modules = tomllib.load(handle)["tool"]["setuptools"]["py-modules"]
    assert not [m for m in modules if os.path.exists(os.path.join(ROOT, "scripts", m))]
