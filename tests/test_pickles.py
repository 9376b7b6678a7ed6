"""Parameter pickles, read without running code or trusting their bytes
(``core/safe_pickle``): every format Paddle writes reads back, every crafted file is
refused in one line with status 2 (in a child process: a crash is its status), and
mutations of real files are refused or read as arrays (Hypothesis, bounded)."""

import io
import json
import os
import pickle
import re
import subprocess
import sys

import numpy as np
import paddle
import pytest
from crafted_pickles import CORPUS

from conftest import ROOT
from paddle_resnet.core import paddle_internals, safe_pickle
from paddle_resnet.core.errors import USER_ERROR, CheckpointError
from paddle_resnet.training import checkpoint as ckpt


def static_parameters(folder, pir):
    """``paddle.static.save`` (this toolkit's checkpoints, NVIDIA's .pdparams) of a small
    trained program on ``pir`` or the legacy IR; its persistables by name."""
    with paddle_internals.static_ir(pir), paddle.static.scope_guard(paddle.static.Scope()):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [None, 4], "float32")
            loss = paddle.mean(paddle.nn.Linear(4, 3)(x))
            paddle.optimizer.Momentum(0.1).minimize(loss)
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        exe.run(main, feed={"x": np.ones([2, 4], "float32")}, fetch_list=[loss])
        paddle.static.save(main, str(folder / "model"))
        scope = paddle.static.global_scope()
        names = [name for name in ckpt.read_state(str(folder / "model")) if scope.find_var(name)]
        return {name: np.array(scope.find_var(name).get_tensor()) for name in names}


def dygraph_files(folder):
    """What ``paddle.save`` writes in dygraph: PaddleClas' state dicts (a Layer's, its
    optimizer's, with protocol 2 too) and a dict that is no state dict (each Tensor as
    (name, array), a DenseTensor as eval('data', {'data': array}), NumPy scalars);
    {file: the arrays read back should hold}."""
    paddle.disable_static()
    try:
        layer = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3), paddle.nn.BatchNorm2D(4))
        optimizer = paddle.optimizer.Momentum(parameters=layer.parameters())
        layer(paddle.rand([2, 3, 8, 8])).mean().backward()
        optimizer.step()
        tensor = paddle.to_tensor(np.arange(6, dtype=np.float32))
        files = {
            "layer.pdparams": (layer.state_dict(), {}),
            "optimizer.pdopt": (optimizer.state_dict(), {}),
            "protocol2.pdparams": (layer.state_dict(), {"protocol": 2}),
            "other.pdparams": (
                {"w": tensor, "step": np.int64(7), "dense": [tensor.value().get_tensor()]},
                {},
            ),
        }
        expected = {}
        for name, (obj, options) in files.items():
            paddle.save(obj, str(folder / name), **options)
            expected[name] = {
                key: value.numpy() for key, value in obj.items() if isinstance(value, paddle.Tensor)
            }
        return expected
    finally:
        paddle.enable_static()


def test_every_paddle_format_of_parameters_loads_without_pickle(tmp_path):
    """What Paddle writes (paddle.save in dygraph, paddle.static.save on either IR) reads
    back through the restricted unpickler with every array; Paddle 2.6.2 and 3.3.1."""
    written = dygraph_files(tmp_path)
    assert len(written) == 4
    for name, arrays in written.items():
        state = ckpt.read_pickle(str(tmp_path / name))
        assert arrays and set(arrays) <= set(state), name
        for key, value in arrays.items():
            np.testing.assert_array_equal(state[key], value, err_msg=f"{name}: {key}")
    other = ckpt.read_pickle(str(tmp_path / "other.pdparams"))
    assert other["step"] == 7
    np.testing.assert_array_equal(other["dense"][0], np.arange(6, dtype=np.float32))
    for pir in (False, True) if paddle_internals.PADDLE3 else (False,):
        folder = tmp_path / ("pir" if pir else "legacy")
        folder.mkdir()
        saved = static_parameters(folder, pir)
        state = ckpt.read_state(str(folder / "model"))
        assert saved and set(saved) == set(state)
        for key, value in saved.items():
            np.testing.assert_array_equal(state[key], value, err_msg=key)


class _Calls:
    """Pickled as the call of ``function`` with ``args``."""

    def __init__(self, function, args):
        self.call = (function, args)

    def __reduce__(self):
        return self.call


@pytest.mark.parametrize(
    "call, named",
    [
        (lambda marker: (eval, (f"__import__('os').system('touch {marker}')",)), "builtins.eval"),
        (lambda marker: (eval, ("data", {"data": f"touch {marker}"})), "builtins.eval"),
        (lambda marker: (os.system, (f"touch {marker}",)), "posix.system"),
        (lambda marker: (subprocess.call, (["touch", str(marker)],)), "subprocess.call"),
        (lambda marker: (getattr, (str(marker), "upper")), "builtins.getattr"),
        (lambda marker: (np.save, (str(marker), np.ones(1))), "numpy.save"),
        (lambda marker: (open, (str(marker), "w")), "io.open"),
    ],
    ids=[
        "eval",
        "eval-in-paddles-form",
        "os-system",
        "subprocess",
        "getattr",
        "numpy-save",
        "open",
    ],
)
def test_a_pickle_asking_for_more_than_arrays_is_refused_before_the_call(tmp_path, call, named):
    marker = tmp_path / "created"
    path = tmp_path / "crafted.pdparams"
    path.write_bytes(pickle.dumps({"conv1.weight": _Calls(*call(marker))}))
    with pytest.raises(
        CheckpointError, match=rf"crafted\.pdparams: refused: .* {re.escape(named)}"
    ):
        ckpt.read_pickle(str(path))
    assert not marker.exists()


def read_in_children(mode, *args):
    result = subprocess.run(
        [sys.executable, os.path.join("tests", "read_pickles.py"), mode, *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_every_crafted_pickle_is_refused_in_one_line_with_status_2(tmp_path):
    """Each published way past an allow-list unpickler, and the forged dtype that ended
    every rank with SIGSEGV (tests/crafted_pickles.py), read as a tool reads a weights
    file: status 2, one line naming the file, nothing created, no traceback."""
    paths = {}
    for name, data in CORPUS.items():
        paths[name] = tmp_path / (name.replace("/", "--") + ".pdparams")
        paths[name].write_bytes(data)
    ends = {end["file"]: end for end in read_in_children("crafted", *paths.values())}
    wrong = {}
    for name, path in paths.items():
        end = ends[str(path)]
        lines = end["stderr"].splitlines()
        if not (
            end["status"] == USER_ERROR
            and len(lines) == 1
            and lines[0].startswith(f"error: {path}: ")
            and (": refused: " in lines[0] or ": cannot be read (" in lines[0])
        ):
            wrong[name] = (end["status"], lines[-3:])
    assert not wrong, wrong
    assert sorted(os.listdir(tmp_path)) == sorted(
        [path.name for path in paths.values()] + [path.name + ".stderr" for path in paths.values()]
    )


def test_a_crafted_pickle_leaves_nothing_behind_in_the_process(tmp_path):
    """BUILD on what an admitted name returns (a function, a class) would set an
    attribute, x, that every later load sees: refused, and none has it."""
    crafted = [name for name in CORPUS if name.startswith("build-on-admitted/")]
    assert len(crafted) == 6
    for name in crafted:
        path = tmp_path / "crafted.pdparams"
        path.write_bytes(CORPUS[name])
        try:
            ckpt.read_pickle(str(path))
        except CheckpointError as err:
            assert "refused: its pickle sets the state of" in str(err), (name, str(err))
    finder = safe_pickle._Unpickler(io.BytesIO())
    assert len(safe_pickle.ADMITTED) > 5
    kept = [key for key in safe_pickle.ADMITTED if hasattr(finder.find_class(*key), "x")]
    assert not kept, kept


def test_mutated_paddle_files_are_refused_in_one_line_or_read_as_arrays(tmp_path):
    """Hypothesis' mutations of the files this Paddle writes (bytes and opcodes, 600
    examples, derandomized): never a crash, each refused in one line or read as arrays,
    numbers and strings; both happen."""
    dygraph_files(tmp_path)
    static_parameters(tmp_path, pir=False)
    seeds = sorted(
        str(tmp_path / name)
        for name in os.listdir(tmp_path)
        if name.endswith((".pdparams", ".pdopt"))
    )
    (counts,) = read_in_children("mutated", 600, *seeds)
    assert counts["refused"] > 0 and counts["read"] > 0, counts
