"""TensorBoard's event files (tensorboardX's writer), one tracker of ``core/trackers``; its
calls are the ones every tracker takes (VisualDL's writer takes the same)."""

import itertools
import os

from paddle_resnet.core.optional import require

# seconds between the event writers' flushes: what a person watching waits at most
FLUSH_SECONDS = 10
# a count of this process's event writers, in their file names
_WRITERS = itertools.count()


def file_suffix():
    """A start's own file name ending (process and count), so two starts never share one."""
    return f".{os.getpid()}.{next(_WRITERS):04d}"


class TensorBoard:
    """TensorBoard's event files in ``folder``, a file per start; its readers drop the events
    an earlier start wrote from ``purge_step`` on (None: none dropped)."""

    def __init__(self, folder, purge_step):
        module = require("tensorboardX", "--tracker tensorboard")
        self.writer = module.SummaryWriter(
            logdir=folder,
            flush_secs=FLUSH_SECONDS,
            filename_suffix=file_suffix(),
            purge_step=purge_step,
        )

    def scalars(self, values, step):
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def image(self, tag, picture, step):
        self.writer.add_image(tag, picture, step, dataformats="HWC")

    def text(self, tag, text, step):
        self.writer.add_text(tag, text, step)

    def parameters(self, flat):
        rows = "\n".join(f"| {name} | {value} |" for name, value in flat.items())
        self.text("parameters", f"| key | value |\n|---|---|\n{rows}", 0)

    def checkpoint(self, directory, step):
        self.text("checkpoints", directory, step)

    def close(self, status):
        self.writer.close()
