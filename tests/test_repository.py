"""The README, recipes and launch scripts stay in step with the code; the import rule
of docs/architecture.md holds."""

import ast
import builtins
import glob
import itertools
import json
import os
import re
import subprocess
import sys
import tomllib

import pytest

from conftest import ROOT, once
from paddle_resnet.commands import flag_table
from paddle_resnet.core import errors, optional
from paddle_resnet.core.config import InferenceConfig, list_recipes
from paddle_resnet.core.errors import ConfigError
from paddle_resnet.deploy import backends, verify

# Static checks of the repository: run once, on 2.6.2.
pytestmark = once


def generated_block(document, name):
    """The text between ``<!-- NAME:start ... -->`` and ``<!-- NAME:end -->`` of a doc."""
    with open(os.path.join(ROOT, document)) as handle:
        text = handle.read()
    block = text.split(f"<!-- {name}:start")[1].split("-->", 1)[1]
    return block.split(f"<!-- {name}:end -->")[0].lstrip("\n")


def test_the_flag_table_is_the_generated_one():
    assert generated_block("docs/flags.md", "flag-table") == flag_table.table(), (
        "docs/flags.md's flag table is stale: paste the output of python -m "
        "paddle_resnet.commands.flag_table"
    )


def test_the_guides_exit_status_table_is_the_one_the_tools_follow():
    assert generated_block("docs/guide.md", "exit-statuses") == errors.exit_status_table(), (
        "docs/guide.md's exit-status table is stale: paste the output of python -c "
        "'from paddle_resnet.core import errors; print(errors.exit_status_table(), end=\"\")'"
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


def deferred_imports_allowed(path, function):
    """The import rule's one exception: a command (commands/*.py) imports what loads Paddle
    after its first step, in its functions; ``bootstrap.prepare_process`` imports Paddle."""
    relative = os.path.relpath(path, ROOT)
    return os.path.dirname(relative) == os.path.join("paddle_resnet", "commands") or (
        relative == os.path.join("paddle_resnet", "core", "bootstrap.py")
        and function.name == "prepare_process"
    )


def test_imports_are_at_the_top_of_every_module():
    """docs/architecture.md, the import rule: no import inside a function, but where a
    command's process is prepared first."""
    nested = []
    for path in tracked_python_files():
        with open(path) as handle:
            tree = ast.parse(handle.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if deferred_imports_allowed(path, node):
                    continue
                nested += [
                    f"{os.path.relpath(path, ROOT)}:{inner.lineno}"
                    for inner in ast.walk(node)
                    if isinstance(inner, (ast.Import, ast.ImportFrom))
                ]
    assert not nested, nested


ENTRY_POINTS = ("train", "export_model", "inference", "program")


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
        if name.split(".")[0] in ENTRY_POINTS
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


def test_the_python_required_is_the_python_used():
    """pyproject.toml's requires-python is the oldest Python the code runs on (3.11:
    ``python -P``, tomllib), and ruff checks against that version."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        project = tomllib.load(handle)
    assert project["project"]["requires-python"] == ">=3.11"
    assert project["tool"]["ruff"]["target-version"] == "py311"


def test_shell_scripts_parse_and_name_real_recipes():
    scripts = glob.glob(os.path.join(ROOT, "scripts", "**", "*.sh"), recursive=True)
    assert len(scripts) > 20
    recipes = set(list_recipes())
    launched = []
    for script in scripts + [os.path.join(ROOT, ".ci", "run")]:
        subprocess.run(["bash", "-n", script], check=True)
        with open(script) as handle:
            text = handle.read()
        launched += re.findall(r'launch\.sh" (\S+) ', text)
    assert launched and set(launched) <= recipes, set(launched) - recipes


def test_every_doc_a_file_names_exists():
    """A script, test or page that points to docs/<page>.md points to a page of the
    repository (not to notes kept elsewhere)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    named = set()
    for path in listed:
        if path.endswith((".py", ".sh", ".md", ".yaml", ".toml", ".sbatch")) and os.path.exists(
            os.path.join(ROOT, path)
        ):
            with open(os.path.join(ROOT, path), errors="replace") as handle:
                named |= {(page, path) for page in re.findall(r"docs/[\w.-]+\.md", handle.read())}
    assert len(named) > 10
    missing = sorted(
        f"{path}: {page}" for page, path in named if not os.path.exists(os.path.join(ROOT, page))
    )
    assert not missing, missing


def test_launch_script_rejects_bad_arguments():
    launch = os.path.join(ROOT, "scripts", "training", "launch.sh")
    result = subprocess.run(
        ["bash", launch, "resnet50_paddle_90e", "8", "FP8"], capture_output=True, text=True
    )
    assert result.returncode == 2 and "PRECISION must be AMP or TF32" in result.stderr


def documented_floors():
    """({folder: floor}, [serving modules]) from the table of folders of
    docs/architecture.md: rows ``| N. `folder/` | ...`` and the list of serving files."""
    with open(os.path.join(ROOT, "docs", "architecture.md")) as handle:
        text = handle.read()
    rows = re.findall(r"^\| (\d+)\. `(\w+)/` \|", text, re.M)
    serving = re.search(r"^The serving files: (.+)$", text, re.M).group(1)
    return {folder: int(floor) for floor, folder in rows}, re.findall(r"`(deploy/\w+)`", serving)


def package_modules():
    """{dotted module name: its path} of every module of the package."""
    package = os.path.join(ROOT, "paddle_resnet")
    modules = {}
    for path in glob.glob(os.path.join(package, "**", "*.py"), recursive=True):
        relative = os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".")
        modules[relative.removesuffix(".__init__")] = path
    return modules


def package_edges(path, modules):
    """The package modules ``path`` imports (``from paddle_resnet.deploy import exported``
    is an edge to ``paddle_resnet.deploy.exported``)."""
    with open(path) as handle:
        tree = ast.parse(handle.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("paddle_resnet"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("paddle_resnet"):
            for alias in node.names:
                leaf = f"{node.module}.{alias.name}"
                yield leaf if leaf in modules else node.module


def folder_of(module):
    """``paddle_resnet.training.sparsity.masks`` -> ``training``; the package root -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_import_runs_down_the_floors_of_the_house():
    """docs/architecture.md: every module lives in a documented folder, and every import
    edge of the package goes to the module's own folder or a lower floor (folders on one
    floor, data/ and models/, do not import each other); the serving files of deploy/
    import core/ and each other only, so a serving machine needs no training code."""
    floors, serving = documented_floors()
    assert set(floors) == {"core", "data", "models", "training", "deploy", "commands"}
    modules = package_modules()
    homeless = [m for m in modules if m != "paddle_resnet" and folder_of(m) not in floors]
    assert not homeless, f"modules outside the documented folders: {homeless}"
    serving = {"paddle_resnet." + s.replace("/", ".") for s in serving}
    assert serving <= set(modules), serving - set(modules)
    wrong, edges = [], 0
    for module, path in modules.items():
        if module == "paddle_resnet":  # the bootstrap: imports core/ on purpose
            continue
        own = folder_of(module)
        for target in package_edges(path, modules):
            edges += 1
            other = folder_of(target)
            if other is None or (other != own and floors[other] >= floors[own]):
                wrong.append(f"{module} ({own}, floor {floors[own]}) imports {target}")
            elif module in serving and other != "core" and target not in serving:
                wrong.append(f"serving file {module} imports {target}")
    assert edges > 150
    assert not wrong, wrong


def unnamed_modules(table, modules):
    """The modules (and sub-folders) of the package that the floors table ``table`` (its
    rows' text) does not name: a module ``x`` of folder ``f/`` is named as `x` in f's row, a
    sub-folder ``f/s/`` as `s/`."""
    rows = dict(re.findall(r"^\| \d+\. `(\w+)/` \|(.*)$", table, re.M))
    missing = []
    for module, path in modules.items():
        parts = module.split(".")
        if len(parts) < 3:  # the package, a folder's __init__
            continue
        folder, name = parts[1], parts[2]
        sub_folder = len(parts) > 3 or path.endswith("__init__.py")
        if (f"`{name}/`" if sub_folder else f"`{name}`") not in rows.get(folder, ""):
            missing.append(f"{folder}/{name}")
    return sorted(set(missing))


def test_the_floors_table_names_every_module():
    """docs/architecture.md's table of floors names each module (and sub-folder) in its
    folder's row; the check fails when one is left out."""
    with open(os.path.join(ROOT, "docs", "architecture.md")) as handle:
        table = handle.read()
    modules = package_modules()
    assert unnamed_modules(table, modules) == []
    left_out = table.replace("`rendezvous`", "the start's meetings")
    assert unnamed_modules(left_out, modules) == ["training/rendezvous"]


def class_names(path):
    with open(path) as handle:
        tree = ast.parse(handle.read())
    return [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]


def test_a_backend_is_a_module_and_a_row(tmp_path, monkeypatch):
    """docs/architecture.md, a new backend: a module in deploy/ (its classifier), a row of
    ``BACKENDS``, and its optional package in core/optional.py. Every classifier of
    deploy/ is built by a row; every package the code requires is declared; and a row
    added here is verified by the export and has its precision flag checked, with no
    other change."""
    modules = package_modules()
    table = set(package_edges(modules["paddle_resnet.deploy.backends"], modules))
    classifiers = {
        module
        for module, path in modules.items()
        if folder_of(module) == "deploy"
        and any(name.endswith("Classifier") for name in class_names(path))
    }
    assert len(classifiers) >= 3 and classifiers <= table, classifiers - table
    required = set()
    for path in modules.values():
        with open(path) as handle:
            tree = ast.parse(handle.read())
        required |= {
            node.args[0].value.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and ast.unparse(node.func).split(".")[-1] == "require"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        }
    assert {"openvino", "onnxruntime"} <= required <= set(optional.PACKAGES), required
    echo = backends.Backend("echo", "cpu", ("fp32",), lambda: True, lambda *args: None)
    monkeypatch.setitem(backends.BACKENDS, "echo", echo)
    (tmp_path / "inference.pdmodel").touch()
    rows = verify.candidates(str(tmp_path), InferenceConfig(), [3, 8, 8], 4, quantized=False)
    assert "echo fp32" in [row.name for row in rows]
    with pytest.raises(ConfigError, match="^--cpu-precision bf16: --backend echo runs fp32$"):
        backends.check_precision(echo, InferenceConfig(cpu_precision="bf16"))


# What a tool may import of training/ to get its programs and weights: the path training
# itself takes (training/prepare.py, training/start_weights.py).
PREPARATION = {"paddle_resnet.training.prepare", "paddle_resnet.training.start_weights"}


def test_tools_take_their_programs_from_the_preparation():
    """Export imports of training/ only the preparation training uses, and no script
    builds programs by hand (``build_programs``, running a ``startup`` program): they call
    ``prepare.ready_for_weights`` or export."""
    modules = package_modules()
    export = set(package_edges(modules["paddle_resnet.deploy.export"], modules))
    training = {module for module in export if folder_of(module) == "training"}
    assert training and training <= PREPARATION, training - PREPARATION
    by_hand = []
    for path in glob.glob(os.path.join(ROOT, "scripts", "**", "*.py"), recursive=True):
        with open(path) as handle:
            tree = ast.parse(handle.read())
        by_hand += [
            f"{os.path.relpath(path, ROOT)}:{node.lineno} {ast.unparse(node)}"
            for node in ast.walk(tree)
            if (isinstance(node, ast.Attribute) and node.attr in ("startup", "build_programs"))
            or (isinstance(node, ast.Name) and node.id == "build_programs")
        ]
    assert not by_hand, by_hand


def test_the_export_folder_module_holds_its_format_only():
    """deploy/exported.py is the folder's layout, model.json and readers: under 200 lines,
    on core/ alone, converting nothing (the conversions need optional packages: none is
    required there)."""
    modules = package_modules()
    path = modules["paddle_resnet.deploy.exported"]
    with open(path) as handle:
        text = handle.read()
    assert len(text.splitlines()) < 200
    assert {folder_of(m) for m in package_edges(path, modules)} == {"core"}
    assert "require(" not in text


def identifiers(node):
    """The names and attribute names in ``node``: ``config.model.arch`` -> config, model, arch."""
    return {
        n.id if isinstance(n, ast.Name) else n.attr
        for n in ast.walk(node)
        if isinstance(n, (ast.Name, ast.Attribute))
    }


def run_folder_joins(path):
    """The lines of ``path`` that join an output folder and a model's arch into a path
    (``os.path.join(config.run.output_dir, config.model.arch, ...)``, ``Path(output_dir) /
    arch``): the run folder <output-dir>/<arch> built by hand."""
    with open(path) as handle:
        tree = ast.parse(handle.read())
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("path.join"):
            parts = node.args
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            parts = [node.left, node.right]
        else:
            continue
        named = [identifiers(part) for part in parts]  # two of the parts, not one call's
        if any("output_dir" in a and "arch" in b for a, b in itertools.permutations(named, 2)):
            lines.append(node.lineno)
    return lines


# What decides or makes a save: a key of the save policy read, a checkpoint named or
# written (``checkpoint.py`` defines the names and the save, the format; it calls neither)
SAVE_POLICY = {"save_interval", "save_every_minutes", "keep_checkpoints"}
SAVE_CALLS = {"save_checkpoint", "checkpoint_name"}


def save_decisions(path):
    """The lines of ``path`` that read a key of the save policy (``run_cfg.save_interval``)
    or call ``save_checkpoint`` or ``checkpoint_name``: a save decided, named or made."""
    with open(path) as handle:
        tree = ast.parse(handle.read())
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in SAVE_POLICY:
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in SAVE_CALLS:
            lines.append(node.lineno)
    return lines


def test_only_the_run_folder_module_builds_the_run_folder_and_decides_a_save():
    """docs/architecture.md, checkpoints: <output-dir>/<arch> is built in
    training/run_folder.py alone (``arch_folder``) and every other module asks it, so the
    saves, ``--from-checkpoint auto``, the Slurm scripts' progress and the summary cannot
    disagree on where a run's checkpoints are; and whether a save is due (--save-interval,
    --save-every-minutes), the save, its name and the retention after it
    (--keep-checkpoints) are its ``Saves``' alone: the epochs ask it, nothing more."""
    modules = package_modules()
    for found in (run_folder_joins, save_decisions):
        seen = {module: found(path) for module, path in modules.items()}
        # the one room's own, found: the check sees the shape it looks for
        assert seen.pop("paddle_resnet.training.run_folder"), found.__name__
        elsewhere = sorted(f"{module}:{line}" for module, lines in seen.items() for line in lines)
        assert not elsewhere, (found.__name__, elsewhere)


def test_private_paddle_apis_only_in_paddle_internals():
    """Paddle's private attributes and ``from ... import _name``, paddle.base and
    unittest.mock: paddle_internals.py only."""
    found = []
    for module, path in package_modules().items():
        if module == "paddle_resnet.core.paddle_internals":
            continue
        with open(path) as handle:
            tree = ast.parse(handle.read())
        for node in ast.walk(tree):
            private = (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                # os._exit; pickle._Unpickler, Python's own unpickler in Python, whose
                # opcode table core/safe_pickle replaces (CPython's C one cannot be told)
                and not (
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "os", "pickle")
                )
            )
            if private:
                found.append(f"{module}:{node.lineno} {ast.unparse(node)}")
            if isinstance(node, ast.ImportFrom) and not (node.module or "").startswith("paddle_"):
                found += [
                    f"{module}:{node.lineno} from {node.module} import {a.name}"
                    for a in node.names
                    if a.name.startswith("_")
                ]
        for name in top_level_imports(path):
            if name.startswith(("paddle.base", "paddle.fluid", "unittest")):
                found.append(f"{module}: imports {name}")
    assert not found, found


def test_running_an_exported_model_needs_no_dali():
    """Deployment code (the exported format, Paddle Inference and OpenVINO predictors)
    imports no DALI module, so a serving machine needs none."""
    code = (
        "import sys; import paddle_resnet.deploy.exported, paddle_resnet.deploy.predictor, "
        "paddle_resnet.deploy.openvino_runtime; "
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


RATIO = re.compile(r"(\d[\d,]*\.\d+)x(?:\*\*)?(?: <!-- ratio: (.+?) over (.+?) -->)?")


def json_pointer(document, pointer):
    """The value at ``pointer`` (``/results/0/torch_ips``; keys may hold spaces and dots)."""
    value = document
    for part in pointer.strip("/").split("/"):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def test_quoted_figures_are_the_benchmark_files():
    """docs/measurements.md: every decimal figure in a block marked as coming from a
    benchmarks/*.json file is a value of that file, rounded as written, or the value as
    a percentage; a figure written as a ratio ("0.62x") names its pair right after it
    (``<!-- ratio: /a/b over /c/d -->``) and is that pair's quotient."""
    with open(os.path.join(ROOT, "docs", "measurements.md")) as handle:
        page = handle.read()
    blocks = re.findall(
        r"<!-- figures: (benchmarks/[\w.]+) -->\n(.*?)<!-- /figures -->", page, re.S
    )
    assert len(blocks) >= 6
    ratios = figures = 0
    for source, text in blocks:
        with open(os.path.join(ROOT, source)) as handle:
            document = json.load(handle)
        values = list(json_numbers(document))
        for figure, numerator, denominator in RATIO.findall(text):
            assert numerator, f"{figure}x in the {source} block names no pair"
            quotient = json_pointer(document, numerator) / json_pointer(document, denominator)
            decimals = len(figure.split(".")[1])
            assert round(quotient, decimals) == float(figure), (
                f"{figure}x is not {numerator} / {denominator} of {source} ({quotient:.3f})"
            )
            ratios += 1
        plain = RATIO.sub("", text)
        for figure in re.findall(r"(?<![\w.])(\d[\d,]*\.\d+)(?!\.\d)", plain):
            decimals = len(figure.split(".")[1])
            number = float(figure.replace(",", ""))
            candidates = values + [100 * value for value in values]
            assert any(round(value, decimals) == number for value in candidates), (
                f"{figure} is not in {source}"
            )
            figures += 1
    assert ratios >= 6 and figures >= len(blocks)


def test_commands_parse_and_call():
    """Each tool's module in commands/ parses its flags and calls one library function:
    under 150 lines, its work in the folders below."""
    long = {
        path: n
        for path in glob.glob(os.path.join(ROOT, "paddle_resnet", "commands", "*.py"))
        if (n := len(open(path).read().splitlines())) >= 150
    }
    assert not long, long


def test_the_step_loop_reads_on_one_screen():
    """loop.train_one_epoch reads, trains and asks its parts (StepLog: what is shown and
    logged; the stop and divergence agreement; the timed save) whether to act: at most 40
    lines, with its signature and docstring (88 when every part lived inside it)."""
    tree = ast.parse(open(os.path.join(ROOT, "paddle_resnet", "training", "loop.py")).read())
    (function,) = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "train_one_epoch"
    ]
    assert function.end_lineno - function.lineno + 1 <= 40


# Paddle APIs moved to C++ bindings that take only dygraph tensors and PIR values (a
# legacy static variable gets "must be Value, but got Variable"): Paddle's
# paddle/phi/ops/yaml/python_api_info.yaml, as of Paddle 3.3 (PRs #74592, #78198).
MOVED_TO_CPP = {
    "sum", "matmul", "multiply", "argmax", "argmin", "exp", "log", "sqrt", "sigmoid",
    "tanh", "abs", "all", "any", "maximum", "minimum", "isfinite", "round", "floor",
}  # fmt: skip
# Where those APIs live, as a graph builder may name them (through any alias).
PADDLE_API_MODULES = ("paddle", "paddle.tensor", "paddle.nn.functional", "paddle.linalg")


def paddle_names(tree):
    """{local name: the Paddle module or function it stands for} of a module's imports."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "paddle":
                    names[alias.asname or "paddle"] = alias.name if alias.asname else "paddle"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "paddle":
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def moved_api_calls(tree):
    """(line, the API's full name) of each call in ``tree`` of an API in MOVED_TO_CPP."""
    names = paddle_names(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        dotted = ast.unparse(node.func).split(".")
        if dotted[0] not in names:
            continue
        module, _, api = ".".join([names[dotted[0]], *dotted[1:]]).rpartition(".")
        if module in PADDLE_API_MODULES and api in MOVED_TO_CPP:
            yield node.lineno, f"{module}.{api}"


def graph_builders():
    """{path: syntax tree} of every module of the package that imports Paddle: each may
    put ops into a static program (every family's network, the program builders, the
    strategies and rewrites), so none is listed by hand."""
    found = {}
    for module, path in package_modules().items():
        with open(path) as handle:
            tree = ast.parse(handle.read())
        if paddle_names(tree):
            found[os.path.relpath(path, ROOT)] = tree
    return found


def test_graph_builders_call_no_api_paddle_moved_to_cpp():
    """The code that builds the static programs calls none of the APIs Paddle has moved
    to C++ bindings, so the legacy IR keeps building on Paddle 3.x."""
    builders = graph_builders()
    assert {
        "paddle_resnet/models/resnet.py",
        "paddle_resnet/training/programs.py",
        "paddle_resnet/training/pir_strategies.py",
        "paddle_resnet/training/sparsity/masks.py",
    } <= set(builders)
    found = [
        f"{path}:{line} {api}"
        for path, tree in builders.items()
        for line, api in moved_api_calls(tree)
    ]
    assert not found, found
    # the guard sees such a call through the names a module gives Paddle
    sample = (
        "import paddle.nn.functional as F\nfrom paddle import tensor\nF.sigmoid(x)\ntensor.sum(x)"
    )
    assert [api for _, api in moved_api_calls(ast.parse(sample))] == [
        "paddle.nn.functional.sigmoid",
        "paddle.tensor.sum",
    ]


def imports_at_import(statements, modules):
    """The modules that running ``statements`` (a module's top level: not its functions)
    imports, each with the packages above it (``from paddle_resnet.deploy import exported``:
    paddle_resnet, paddle_resnet.deploy and paddle_resnet.deploy.exported)."""
    names = []
    for node in statements:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            names += [
                f"{node.module}.{a.name}"
                for a in node.names
                if f"{node.module}.{a.name}" in modules
            ]
        else:
            names += imports_at_import(ast.iter_child_nodes(node), modules)
    return [".".join(n.split(".")[: i + 1]) for n in names for i in range(n.count(".") + 1)]


def modules_loading_paddle(modules):
    """The package modules whose import loads Paddle: they import it, or a module that
    does, at their top level."""
    imported = {}
    for module, path in modules.items():
        with open(path) as handle:
            imported[module] = set(imports_at_import(ast.parse(handle.read()).body, modules))
    loading = {m for m, names in imported.items() if "paddle" in names}
    while grown := {m for m, names in imported.items() if names & loading} - loading:
        loading |= grown
    return loading


def test_the_front_door_loads_no_paddle():
    """docs/architecture.md, the import rule: importing the package, or a command's module,
    loads no Paddle (each command prepares its process first); the modules that do are
    many (the check sees them)."""
    modules = package_modules()
    loading = modules_loading_paddle(modules)
    front = {m for m in modules if m == "paddle_resnet" or folder_of(m) == "commands"}
    assert len(loading) > 40 and "paddle_resnet.training.programs" in loading
    assert not front & loading, sorted(front & loading)


def test_scripts_set_the_environment_before_paddle_loads():
    """docs/architecture.md, the import rule: a script (scripts/, the tests' child drivers,
    conftest.py) that loads Paddle, itself or through a module of the package (or uses a
    command's functions), prepares the process first (``bootstrap.prepare_process()``; without it Paddle 3.x starts on
    PIR, with its chatter and one math thread)."""
    modules = package_modules()
    commands = {m for m in modules if folder_of(m) == "commands"}  # their run() loads it
    loading = modules_loading_paddle(modules) | commands | {"paddle"}
    paths = glob.glob(os.path.join(ROOT, "scripts", "**", "*.py"), recursive=True)
    paths += glob.glob(os.path.join(ROOT, "tests", "**", "*.py"), recursive=True)
    late, checked = [], 0
    for path in paths:
        name = os.path.basename(path)
        if name.startswith("test_") or "fixtures" in path:  # pytest imports conftest first
            continue
        with open(path) as handle:
            body = ast.parse(handle.read()).body
        for statement in body:
            text = ast.unparse(statement)
            if text.startswith("bootstrap.prepare_process("):
                checked += 1
                break
            if set(imports_at_import([statement], modules)) & loading:
                late.append(os.path.relpath(path, ROOT))
                break
    assert checked > 20 and not late, late


# A test's assertion over a collection passes when the collection is empty: ``assert
# all(...)`` over nothing, or a loop of assertions that never runs. The guard below asks
# that such a collection be asserted on before (``assert ops and all(...)``, ``assert
# len(results) == 3``), unless it is literal data (a list or tuple written in the test, a
# module's CONSTANT, ``range(3)``) or the loop counts its rounds into a number asserted
# after it.
BUILTIN_NAMES = set(dir(builtins))


def collection_names(node):
    """The variables an expression reads, without builtins and module constants."""
    constants = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.Attribute) and inner.attr.isupper():
            constants |= {id(n) for n in ast.walk(inner.value)}
    return {
        n.id
        for n in ast.walk(node)
        if isinstance(n, ast.Name) and id(n) not in constants and not n.id.isupper()
    } - BUILTIN_NAMES


def is_literal_collection(node, literals):
    if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
        return True
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "range":
        return all(isinstance(a, ast.Constant) for a in node.args)
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "enumerate":
        return is_literal_collection(node.args[0], literals)
    return isinstance(node, ast.Name) and node.id in literals


def calls_of_all(test, asserted_before=frozenset()):
    """(all(...) call, names asserted before it in the same ``and``) in an assertion."""
    if isinstance(test, ast.Call) and getattr(test.func, "id", None) == "all":
        yield test, asserted_before
    elif isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        seen = set(asserted_before)
        for value in test.values:
            yield from calls_of_all(value, frozenset(seen))
            seen |= collection_names(value)


def unguarded_collections(function):
    """``path:line`` of each assertion of ``function`` over a collection that may be empty."""
    asserts = [
        (n.lineno, collection_names(n.test))
        for n in ast.walk(function)
        if isinstance(n, ast.Assert)
    ]
    literals = {
        target.id
        for n in ast.walk(function)
        if isinstance(n, ast.Assign) and isinstance(n.value, (ast.List, ast.Tuple))
        for target in n.targets
        if isinstance(target, ast.Name)
    }

    def asserted(names, before=None, after=None):
        return any(
            names & found and (before is None or line < before) and (after is None or line > after)
            for line, found in asserts
        )

    found = []
    for node in ast.walk(function):
        if isinstance(node, ast.Assert):
            for call, before in calls_of_all(node.test):
                comprehension = call.args[0] if call.args else None
                if not isinstance(comprehension, (ast.GeneratorExp, ast.ListComp)):
                    continue
                source = comprehension.generators[0].iter
                names = collection_names(source)
                if is_literal_collection(source, literals) or not names or names & before:
                    continue
                if not asserted(names, before=node.lineno):
                    found.append(node.lineno)
        elif isinstance(node, ast.For):
            body = [inner for statement in node.body for inner in ast.walk(statement)]
            if not any(isinstance(inner, ast.Assert) for inner in body):
                continue
            names = collection_names(node.iter)
            if is_literal_collection(node.iter, literals) or not names:
                continue
            counters = {
                inner.target.id
                for inner in body
                if isinstance(inner, ast.AugAssign) and isinstance(inner.target, ast.Name)
            }
            if asserted(names, before=node.lineno) or asserted(counters, after=node.lineno):
                continue
            found.append(node.lineno)
    return found


def test_no_assertion_over_a_collection_passes_when_it_is_empty():
    unguarded = []
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "test_*.py"))):
        with open(path) as handle:
            tree = ast.parse(handle.read())
        for function in ast.walk(tree):
            if isinstance(function, ast.FunctionDef) and function.name.startswith("test_"):
                where = os.path.relpath(path, ROOT)
                unguarded += [f"{where}:{line}" for line in unguarded_collections(function)]
    assert not unguarded, (
        f"assertions over collections that may be empty (assert the collection first): {unguarded}"
    )


def test_suite_cpu_sums_the_cpu_log_by_track_and_file(tmp_path):
    """scripts/suite_cpu.py, as a maintainer runs it, over the lines conftest writes."""
    log = tmp_path / "cpu.jsonl"
    rows = [
        {"test": "tests/test_a.py::one", "track": ".venv", "cpu": 2.0, "wall": 3.0, "rss_mb": 900},
        {"test": "tests/test_a.py::two", "track": ".venv", "cpu": 1.0, "wall": 1.0, "rss_mb": 700},
        {"test": "tests/test_b.py::one", "track": ".venv-paddle3", "cpu": 1.0, "wall": 2.0},
    ]
    log.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = subprocess.run(
        [sys.executable, "scripts/suite_cpu.py", str(log)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "4 CPU-seconds in tests: .venv 3, .venv-paddle3 1"
    assert lines[2].split() == ["3.0", "75.0%", "4.0", "2", "900", ".venv", "tests/test_a.py"]
    assert lines[3].split()[4] == "0"  # a log written before conftest recorded the memory
