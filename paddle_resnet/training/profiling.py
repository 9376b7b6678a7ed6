"""Profiling a window of training steps: --profile-start-step / --profile-stop-step
(NVIDIA's ENABLE_PROFILE, PROFILE_START_STEP, PROFILE_STOP_STEP; scripts/nsys_profiling.sh
maps those to the flags).

Inside the window [start, stop) of global steps the Paddle profiler writes a Chrome
trace to <output-dir>/profile; on GPUs each step is an NVTX range and the window the CUDA
profiler's capture range (``nsys profile --capture-range=cudaProfilerApi``).
"""

import contextlib
import os

import paddle.profiler as profiler

from paddle_resnet.core import paddle_internals
from paddle_resnet.core.devices import gpu_available

DEFAULT_STEPS = 10
TRACE_FOLDER = "profile"


def window(run_config):
    """(start, stop) global steps to profile, or None."""
    start = run_config.profile_start_step
    if start is None:
        return None
    return start, run_config.profile_stop_step or start + DEFAULT_STEPS


def _nvtx():
    """(push, pop, capture start, capture stop), or None where no GPU runs the steps."""
    return paddle_internals.nvtx_functions() if gpu_available() else None


class StepProfiler:
    """``with profiler.step(global_step): ...`` around each training step."""

    def __init__(self, steps, output_dir):
        self.start, self.stop = steps
        self.trace_dir = os.path.join(output_dir, TRACE_FOLDER)
        self.nvtx = _nvtx()
        self._paddle = None

    @contextlib.contextmanager
    def step(self, global_step):
        if global_step == self.start:
            self._begin()
        active = self._paddle is not None
        if active and self.nvtx:
            self.nvtx[0](f"step {global_step}")
        yield
        if active:
            if self.nvtx:
                self.nvtx[1]()
            self._paddle.step()
            if global_step + 1 >= self.stop:
                self.close()

    def _begin(self):
        targets = [profiler.ProfilerTarget.CPU]
        if gpu_available():
            targets.append(profiler.ProfilerTarget.GPU)
        self._paddle = profiler.Profiler(
            targets=targets, on_trace_ready=profiler.export_chrome_tracing(self.trace_dir)
        )
        if self.nvtx:
            self.nvtx[2]()
        self._paddle.start()

    def close(self):
        """End the window (also when training ends inside it); writes the trace."""
        if self._paddle is None:
            return
        self._paddle.stop()
        if self.nvtx:
            self.nvtx[3]()
        self._paddle = None


class NoProfiler:
    def step(self, global_step):
        return contextlib.nullcontext()

    def close(self):
        pass


def step_profiler(run_config):
    steps = window(run_config)
    return StepProfiler(steps, run_config.output_dir) if steps else NoProfiler()
