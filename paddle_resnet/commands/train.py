"""Train and evaluate a ResNet-family classifier with Paddle static graphs and DALI.

    python train.py --config resnet18_demo --image-root demo_data/fashion_mnist_demo
    python -m paddle.distributed.launch --gpus 0,1,2,3,4,5,6,7 train.py \\
        --config resnet50_paddle_90e --amp --image-root /data/imagenet
"""

import dataclasses
import os
import sys

from paddle_resnet.commands import REGISTRY_CHOICES
from paddle_resnet.core import bootstrap


def export_final_model(config, report):
    """train.py --inference-dir (NVIDIA's): the last checkpoint exported as export_model.py does."""
    from paddle_resnet.deploy import export
    from paddle_resnet.training import run_folder

    final = run_folder.checkpoint_dir(config.run.output_dir, config.model.arch, config.run.epochs)
    run_cfg = dataclasses.replace(
        config.run,
        from_checkpoint=final,
        from_pretrained_params=None,
        last_epoch_of_checkpoint=None,
    )
    inference = dataclasses.replace(
        config.inference, export_log_path=os.path.join(config.run.output_dir, "export.json")
    )
    exported = export.export(dataclasses.replace(config, run=run_cfg, inference=inference))
    report.print(f"exported the final model to {config.inference.model_dir}")
    return {"run.inference_dir": exported["directory"]}


def run(config, report_stream=None):
    """Train (or evaluate) as ``config`` says; with --inference-dir, export the result.
    A run stopped by a signal, saved, returns its exit status."""
    from paddle_resnet.training import run as training_run
    from paddle_resnet.training.lifecycle import Stopped

    after = export_final_model if config.inference.model_dir else None
    try:
        return training_run.run(config, report_stream, after_training=after)
    except Stopped as stop:
        return stop.exit_code


def main(argv=None):
    """The training command: restarted on tcmalloc where it is the toolkit's, then prepared."""
    bootstrap.preload_allocator()
    bootstrap.prepare_process(argv)
    # imported after the restart: the process that starts again imports no more than it must
    from paddle_resnet.core.cli import main_with

    return main_with("train", __doc__.splitlines()[0], run, argv, REGISTRY_CHOICES)


if __name__ == "__main__":
    sys.exit(main())
