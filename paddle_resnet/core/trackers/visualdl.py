"""VisualDL's records, one tracker of ``core/trackers``: the same calls as TensorBoard's
writer."""

import contextlib
import io
import os

from paddle_resnet.core.optional import require
from paddle_resnet.core.trackers.tensorboard import FLUSH_SECONDS, TensorBoard, file_suffix


class VisualDl(TensorBoard):
    """VisualDL's records in ``folder``: each start writes a file of its own, but a resumed
    run, which appends to the newest file (VisualDL shows a folder's newest file only)."""

    def __init__(self, folder, resume):
        module = require("visualdl", "--tracker visualdl")
        names = os.listdir(folder) if resume and os.path.isdir(folder) else []
        newest = sorted(name for name in names if "vdlrecords" in name)[-1:]
        with contextlib.redirect_stdout(io.StringIO()):  # its "will add logs to it"
            self.writer = module.LogWriter(
                logdir=folder,
                flush_secs=FLUSH_SECONDS,
                filename_suffix=file_suffix(),
                file_name=newest[0] if newest else "",
            )
