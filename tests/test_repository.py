"""The README, recipes and launch scripts stay in step with the code; the import rule
of docs/architecture.md holds."""

import ast
import glob
import json
import os
import re
import subprocess
import sys

import tomllib

from conftest import ROOT, once
from paddle_resnet.cli import flag_table_markdown
from paddle_resnet.config import list_recipes

# Static checks of the repository: run once, on 2.6.2.
pytestmark = once


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


def documented_layers():
    """{module path under paddle_resnet/ (a folder ends in "/"): layer number}, from the
    layer table of docs/architecture.md."""
    with open(os.path.join(ROOT, "docs", "architecture.md")) as handle:
        rows = re.findall(r"^\| (\d+)\. [^|]+\| ([^|]+)\|", handle.read(), re.M)
    return {name: int(number) for number, cell in rows for name in re.findall(r"`([^`]+)`", cell)}


def package_modules():
    """{dotted module name: its path} of every module of the package."""
    package = os.path.join(ROOT, "paddle_resnet")
    modules = {}
    for path in glob.glob(os.path.join(package, "**", "*.py"), recursive=True):
        relative = os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".")
        modules[relative.removesuffix(".__init__")] = path
    return modules


def docstring_only(path):
    """A package's __init__ that only describes its folder: in no layer."""
    with open(path) as handle:
        body = ast.parse(handle.read()).body
    return len(body) == 1 and isinstance(body[0], ast.Expr)


def layer_of(module, layers):
    """The documented layer of a dotted module name (a package's __init__ counts with its
    folder), or None."""
    path = module.removeprefix("paddle_resnet").lstrip(".").replace(".", "/")
    if path in layers:
        return layers[path]
    folder = path.split("/")[0] + "/"
    return layers.get(folder) or layers.get(path.split("/")[0])


def test_the_layer_table_is_the_import_graph():
    """docs/architecture.md: every module is in the table, and imports only from its own
    layer and the layers above it; the foundations import no Paddle or DALI module."""
    layers, modules = documented_layers(), package_modules()
    assert len(layers) > 30
    unlisted = [
        m
        for m, path in modules.items()
        if m != "paddle_resnet" and layer_of(m, layers) is None and not docstring_only(path)
    ]
    assert not unlisted, f"modules missing from the layer table: {unlisted}"
    upward, foundations_with_paddle = [], []
    for module, path in modules.items():
        if module == "paddle_resnet":  # the bootstrap itself: loads Paddle on purpose
            continue
        own = layer_of(module, layers)
        for name in top_level_imports(path):
            if name.split(".")[0] in ("paddle", "nvidia") and own == 1:
                foundations_with_paddle.append(f"{module}: {name}")
            if not name.startswith("paddle_resnet.") and name != "paddle_resnet":
                continue
            target = name if name in modules else name.rpartition(".")[0]
            other = layer_of(target, layers) if target != "paddle_resnet" else 0
            if other is not None and other > own:
                upward.append(f"{module} (layer {own}) imports {name} (layer {other})")
    assert not upward, upward
    assert not foundations_with_paddle, foundations_with_paddle


def test_private_paddle_apis_only_in_paddle_internals():
    """Paddle's private attributes, paddle.base and unittest.mock: paddle_internals.py only."""
    found = []
    for module, path in package_modules().items():
        if module == "paddle_resnet.paddle_internals":
            continue
        with open(path) as handle:
            tree = ast.parse(handle.read())
        for node in ast.walk(tree):
            private = (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "os"))
            )
            if private:
                found.append(f"{module}:{node.lineno} {ast.unparse(node)}")
        for name in top_level_imports(path):
            if name.startswith(("paddle.base", "paddle.fluid", "unittest")):
                found.append(f"{module}: imports {name}")
    assert not found, found


def test_running_an_exported_model_needs_no_dali():
    """Deployment code (the exported format, Paddle Inference and OpenVINO predictors)
    imports no DALI module, so a serving machine needs none."""
    code = (
        "import sys; import paddle_resnet.exported, paddle_resnet.predictor, "
        "paddle_resnet.openvino_runtime; "
        "print(sorted(m for m in sys.modules if m.startswith('nvidia')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def json_numbers(value):
    """Every number in a JSON document."""
    if isinstance(value, dict):
        for item in value.values():
            yield from json_numbers(item)
    elif isinstance(value, list):
        for item in value:
            yield from json_numbers(item)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value


def test_quoted_figures_are_the_benchmark_files():
    """docs/measurements.md: every decimal figure in a block marked as coming from a
    benchmarks/*.json file is a value of that file, rounded as written, or the value as
    a percentage, or (a figure written as a ratio, "0.62x") the ratio of two values."""
    with open(os.path.join(ROOT, "docs", "measurements.md")) as handle:
        page = handle.read()
    blocks = re.findall(
        r"<!-- figures: (benchmarks/[\w.]+) -->\n(.*?)<!-- /figures -->", page, re.S
    )
    assert len(blocks) >= 6
    for source, text in blocks:
        with open(os.path.join(ROOT, source)) as handle:
            values = list(json_numbers(json.load(handle)))
        for figure, ratio in re.findall(r"(?<![\w.])(\d[\d,]*\.\d+)(?!\.\d)(x?)", text):
            decimals = len(figure.split(".")[1])
            number = float(figure.replace(",", ""))
            candidates = (
                [a / b for a in values for b in values if b]
                if ratio
                else values + [100 * value for value in values]
            )
            assert any(round(value, decimals) == number for value in candidates), (
                f"{figure}{ratio} is not in {source}"
            )
