"""For the Slurm scripts (scripts/cluster/slurm): the checkpoint folder of train.py's flags
and its newest checkpoint whose files verify, on one line separated by a tab ("-" for
none), so that a start can tell whether the one before made progress: a checkpoint that
verifies, not any new meta.json (a staged copy, a damaged one).

    python -m paddle_resnet.commands.job_progress TRAIN_FLAGS...

Exit status 2 for bad flags, in train.py's own line."""

import os
import sys

from paddle_resnet.core import bootstrap
from paddle_resnet.core.cli import parse
from paddle_resnet.core.errors import CheckpointError, exit_status


def main(argv=None):
    bootstrap.prepare_process(argv)
    from paddle_resnet.training import run_folder

    def progress():
        config = parse("train", sys.argv[1:] if argv is None else argv)
        folder = run_folder.arch_folder(config.run.output_dir, config.model.arch)
        try:
            newest = run_folder.Checkpoints(folder).newest_verified(lambda line: None)
        except CheckpointError:  # every checkpoint damaged: none verifies
            newest = None
        print(f"{folder}\t{os.path.basename(newest) if newest else '-'}")

    return exit_status(progress)


if __name__ == "__main__":
    sys.exit(main())
