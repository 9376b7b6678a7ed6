"""The CPU kernels of a run that names none: measured once per machine and shape in a
process of its own, kept in the user's cache, said in one line; multi-process jobs and
a pinned choice do not measure."""

import json
import os

from conftest import once, pir_rehearsal, small_config
from paddle_resnet.training import cpu_kernels


@pir_rehearsal
@once
def test_unset_kernels_are_measured_once_then_read_from_the_cache(
    fmnist_root, tmp_path, monkeypatch
):
    monkeypatch.delenv(cpu_kernels.PIN_VARIABLE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_kernels.os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # a quiet host
    measured = []
    real_measure = cpu_kernels.measure
    monkeypatch.setattr(
        cpu_kernels, "measure", lambda c: measured.append(real_measure(c)) or measured[-1]
    )
    config = small_config(fmnist_root, tmp_path, **{"run.ir": None})
    resolved, choice = cpu_kernels.resolved(config, world_size=1)
    assert choice.how == "measured", choice
    assert choice.plain_ips > 0 and choice.onednn_ips > 0
    assert choice.onednn == (choice.onednn_ips > choice.plain_ips)
    assert resolved.run.cpu_onednn is choice.onednn
    path, key = cpu_kernels.cache_path(), cpu_kernels.cache_key(config)
    # kept where one path was faster in every round of slices (the machine may be shared)
    if not cpu_kernels._apart(measured[0]):
        assert "measured now (not kept: the two speeds are within their spread)" in choice.line()
        assert not os.path.exists(path)
        # a measurement that was apart, kept the same way, for the rest of the test
        os.makedirs(os.path.dirname(path))
        with open(path, "w") as handle:
            json.dump({key: dict(measured[0], plain_slices=[1.0], onednn_slices=[2.0])}, handle)
    else:
        assert choice.line().startswith(
            f"CPU kernels: {choice.name}, measured now (kept in {path}): oneDNN "
        ), choice.line()
    with open(path) as handle:
        cached = json.load(handle)
    assert list(cached) == [key]
    assert len(cached[key]["plain_slices"]) == len(cached[key]["onednn_slices"])
    # measured on a busy host: used, not kept
    monkeypatch.setattr(cpu_kernels.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    busy = small_config(fmnist_root, tmp_path, **{"run.ir": None, "data.batch_size": 8})
    loaded = cpu_kernels.resolved(busy, world_size=1)[1]
    assert "measured now (not kept: the machine was busy)" in loaded.line()
    with open(path) as handle:
        assert list(json.load(handle)) == [cpu_kernels.cache_key(config)]
    # another shape is another entry; ranks and a named choice measure nothing
    other = small_config(fmnist_root, tmp_path, **{"run.ir": None, "data.batch_size": 8})
    assert cpu_kernels.cache_key(other) != cpu_kernels.cache_key(config)
    ranks = cpu_kernels.resolved(config, world_size=2)[1]
    assert (ranks.onednn, ranks.how) == (False, "multi-process")
    named = small_config(fmnist_root, tmp_path, **{"run.cpu_onednn": False})
    assert cpu_kernels.resolved(named, world_size=1) == (named, None)
    monkeypatch.setenv(cpu_kernels.PIN_VARIABLE, "plain")
    pinned = cpu_kernels.resolved(config, world_size=1)[1]
    assert pinned.line() == f"CPU kernels: plain ({cpu_kernels.PIN_VARIABLE} says so)"
