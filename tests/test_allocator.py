"""Training runs on tcmalloc where it is installed (``bootstrap.preload_allocator``): the
command starts itself again with it preloaded, keeping its process id; other commands
and imports are left as they are; PADDLE_RESNET_ALLOCATOR=system opts out."""

import os
import subprocess
import sys

import pytest

from conftest import once
from paddle_resnet.core import bootstrap

# What the process reports: its allocator, its process id, and whether it was started again
PROBE = (
    "import os, sys\n"
    "import paddle_resnet\n"
    "from paddle_resnet.core import bootstrap\n"
    "print(bootstrap.allocator(), os.getpid())\n"
)


def test_the_training_commands_are_recognised_on_any_command_line():
    assert bootstrap.command_of(["python", "train.py", "--epochs", "1"]) == "train.py"
    assert bootstrap.command_of(["python", "-u", "/work/x/train.py"]) == "train.py"
    assert bootstrap.command_of(["python", "-X", "dev", "-m", "paddle_resnet.commands.train"]) == (
        "paddle_resnet.commands.train"
    )
    assert bootstrap.command_of(["/venv/bin/python", "/venv/bin/paddle-resnet-train"]) == (
        "paddle-resnet-train"
    )
    assert bootstrap.command_of(["python", "-c", "import train"]) == ""
    assert bootstrap.command_of(["python"]) == ""
    assert bootstrap.command_of(["python", "-m", "pytest", "tests"]) == "pytest"


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


def run_probe(tmp_path, name, **environ):
    script = tmp_path / name
    script.write_text(PROBE)
    env = {key: value for key, value in os.environ.items() if key != "LD_PRELOAD"}
    process = subprocess.Popen(
        [sys.executable, str(script)],
        env={**env, **environ},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-2000:]
    used, pid = out.split()
    return used, int(pid), process.pid


@once
@pytest.mark.skipif(not os.path.exists(bootstrap.TCMALLOC), reason="no libtcmalloc-minimal4")
def test_a_training_command_runs_on_tcmalloc_in_the_same_process(tmp_path):
    used, pid, started = run_probe(tmp_path, "train.py")
    assert (used, pid) == ("tcmalloc", started)  # started again in place: the same id
    assert run_probe(tmp_path, "train.py", PADDLE_RESNET_ALLOCATOR="system")[0] == "system"
    assert run_probe(tmp_path, "export_model.py")[0] == "system"


@once
def test_an_unknown_allocator_is_one_line_and_status_2(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PROBE)
    env = {**os.environ, bootstrap.ALLOCATOR_VARIABLE: "jemalloc"}
    result = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == (
        "error: PADDLE_RESNET_ALLOCATOR=jemalloc: not an allocator this toolkit sets; "
        "use tcmalloc (the default) or system"
    )
