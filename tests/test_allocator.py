"""Training runs on tcmalloc where it is installed (``bootstrap.preload_allocator``): the
toolkit's own training command starts itself again with it preloaded, keeping its process
id, and says so in its first lines; other commands, other projects' scripts named train.py
and imports are left as they are; PADDLE_RESNET_ALLOCATOR=system opts out."""

import json
import os
import subprocess
import sys

import pytest

from conftest import FAST_TRAIN, ROOT, once
from paddle_resnet.core import bootstrap

# What the process reports: its allocator, its process id and its arguments
PROBE = (
    "import os, sys\n"
    "import paddle_resnet\n"
    "from paddle_resnet.core import bootstrap\n"
    "print(bootstrap.allocator(), os.getpid(), ' '.join(sys.argv[1:]))\n"
)


def test_only_the_toolkits_own_training_command_is_recognised(tmp_path):
    train_py = os.path.join(ROOT, "train.py")
    for argv in (
        ["python", "-u", train_py, "--epochs", "1"],
        ["python", os.path.relpath(train_py), "--epochs", "1"],
        ["python", "-X", "dev", "-m", "paddle_resnet.commands.train"],
        ["/venv/bin/python", "/venv/bin/paddle-resnet-train"],
    ):
        assert bootstrap.is_training_command(argv), argv
    for argv in (
        ["python", str(tmp_path / "train.py")],  # another project's script of that name
        ["python", "-c", "import train"],
        ["python"],
        ["python", "-m", "pytest", "tests"],
        ["python", os.path.join(ROOT, "export_model.py")],
    ):
        assert not bootstrap.is_training_command(argv), argv


def test_the_training_environment_preloads_tcmalloc_once(tmp_path):
    library = tmp_path / "libtcmalloc_minimal.so.4"
    library.write_bytes(b"")
    environ = {"LD_PRELOAD": "/lib/other.so"}
    wanted = bootstrap.training_environment(environ, str(library))
    assert wanted["LD_PRELOAD"] == f"{library}:/lib/other.so"
    assert bootstrap.training_environment(wanted, str(library)) is wanted  # already in
    opted_out = {bootstrap.ALLOCATOR_VARIABLE: "system"}
    assert bootstrap.training_environment(opted_out, str(library)) is opted_out
    assert bootstrap.training_environment({}, str(tmp_path / "missing.so")) == {}


def test_tcmalloc_is_looked_for_where_intels_launcher_looks(tmp_path):
    """The active conda environment, then the virtualenv, then ~/.local/lib and the
    system's folders (torch.backends.xeon.run_cpu's order; Debian's multiarch folder too)."""
    for prefix in ("conda", "venv"):
        (tmp_path / prefix / "lib").mkdir(parents=True)
        (tmp_path / prefix / "lib" / "libtcmalloc.so").write_bytes(b"")
    both = {"CONDA_PREFIX": str(tmp_path / "conda"), "VIRTUAL_ENV": str(tmp_path / "venv")}
    assert bootstrap.tcmalloc(both) == str(tmp_path / "conda" / "lib" / "libtcmalloc.so")
    venv = {"VIRTUAL_ENV": str(tmp_path / "venv")}
    assert bootstrap.tcmalloc(venv) == str(tmp_path / "venv" / "lib" / "libtcmalloc.so")
    assert bootstrap.training_environment(venv)["LD_PRELOAD"].startswith(str(tmp_path / "venv"))


def test_a_script_named_train_py_of_another_project_is_left_as_it_is(tmp_path):
    """Importing the package never replaces the process: another project's train.py keeps
    its process id, its arguments and the C library's allocator."""
    script = tmp_path / "train.py"
    script.write_text(PROBE)
    env = {key: value for key, value in os.environ.items() if key != "LD_PRELOAD"}
    process = subprocess.Popen(
        [sys.executable, str(script), "--epochs", "3"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-2000:]
    used, pid, args = out.split(maxsplit=2)
    assert (used, int(pid), args.strip()) == ("system", process.pid, "--epochs 3")


@once
@pytest.mark.skipif(not bootstrap.tcmalloc(), reason="no libtcmalloc-minimal4")
def test_the_training_command_starts_again_on_tcmalloc_and_says_so(fmnist_root, tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "LD_PRELOAD"}
    args = [*FAST_TRAIN, "--image-root", fmnist_root, "--output-dir", str(tmp_path)]
    args += ["--benchmark", "--benchmark-steps", "1", "--benchmark-warmup-steps", "0"]
    result = subprocess.run(
        [sys.executable, "train.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (
        "allocator: tcmalloc, preloaded by the training command, which started itself again "
        "with it (PADDLE_RESNET_ALLOCATOR=system: the C library's)"
    ) in result.stdout.splitlines()
    report = [json.loads(line) for line in open(tmp_path / "report.json")]
    assert [r["data"]["allocator"] for r in report if r["type"] == "PARAMETER"] == ["tcmalloc"]


def test_the_allocator_note_says_why_not_tcmalloc():
    system = {bootstrap.ALLOCATOR_VARIABLE: "system"}
    if bootstrap.allocator() == "system":
        assert bootstrap.allocator_note(system) == (
            "allocator: the C library's (PADDLE_RESNET_ALLOCATOR=system)"
        )


@once
def test_an_unknown_allocator_is_one_line_and_status_2():
    env = {**os.environ, bootstrap.ALLOCATOR_VARIABLE: "jemalloc"}
    result = subprocess.run(
        [sys.executable, "train.py", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == (
        "error: PADDLE_RESNET_ALLOCATOR=jemalloc: not an allocator this toolkit sets; "
        "use tcmalloc (the default) or system"
    )
