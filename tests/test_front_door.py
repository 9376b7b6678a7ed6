"""The package's front door is quiet (docs/architecture.md, the import rule): importing
``paddle_resnet``, and every command's module, in a fresh interpreter leaves the process as
it was: its process id, arguments and environment, no allocator loaded, no Paddle imported.
Each command prepares its process as its first step (``bootstrap.prepare_process``); the
training command's first step starts it again on tcmalloc, which it says
(``test_allocator.py::test_the_training_command_starts_again_on_tcmalloc_and_says_so``, a
real run of train.py)."""

import glob
import json
import os
import subprocess
import sys

from conftest import ROOT, SESSION_MARK

COMMANDS = sorted(
    "paddle_resnet.commands." + os.path.basename(path)[: -len(".py")]
    for path in glob.glob(os.path.join(ROOT, "paddle_resnet", "commands", "[a-z]*.py"))
)
# What the process looks like before and after the imports, and what they loaded
PROBE = """
import json, os, sys
before = os.getpid(), list(sys.argv), dict(os.environ)
import {modules}
after = os.getpid(), list(sys.argv), dict(os.environ)
with open("/proc/self/maps") as maps:
    allocator = "tcmalloc" if "libtcmalloc" in maps.read() else "system"
changed = sorted(k for k in {{**before[2], **after[2]}} if before[2].get(k) != after[2].get(k))
print(json.dumps({{"same": before[:2] == after[:2], "changed": changed, "allocator": allocator,
                  "loaded": sorted({{"paddle", "PIL", "nvidia.dali"}} & set(sys.modules))}}))
"""


def fresh_interpreter(modules):
    """What importing ``modules`` did to a new interpreter started as ``python -c PROBE
    --epochs 3``, in an environment holding none of the variables a command sets."""
    keep = ("PATH", "HOME", "PYTHONPATH", SESSION_MARK)
    env = {name: os.environ[name] for name in keep if name in os.environ}
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(modules=", ".join(modules)), "--epochs", "3"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_importing_the_package_does_nothing_but_import():
    found = fresh_interpreter(["paddle_resnet"])
    assert found == {"same": True, "changed": [], "allocator": "system", "loaded": []}


def test_importing_a_commands_module_loads_no_paddle():
    """The console scripts and ``python -m paddle_resnet.commands.<tool>`` import the
    tool's module before its main runs: it must not load Paddle (nor set its environment)."""
    assert len(COMMANDS) >= 9 and "paddle_resnet.commands.train" in COMMANDS
    found = fresh_interpreter(COMMANDS)
    assert found == {"same": True, "changed": [], "allocator": "system", "loaded": []}
