"""Export a trained ResNet to a Paddle Inference model (probabilities out).

    python export_model.py --config resnet18_demo --from-checkpoint output/demo/resnet18 \\
        --trt-inference-dir inference/resnet18_demo

Writes inference.pdmodel / inference.pdiparams (loadable by paddle.inference on
Paddle 2.6 and 3.x), classes.json, model.json (input shape, layout and
preprocessing, read back by inference.py) and the JSON export report.
"""
import json
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
os.environ.setdefault("FLAGS_enable_pir_api", "0")

from paddle_resnet.cli import main_with  # noqa: E402
from paddle_resnet.errors import CheckpointError, ConfigError  # noqa: E402


def _classes(run_cfg, meta):
    """Class names from the checkpoint, or from a classes.json beside the parameters."""
    from paddle_resnet.data.folder import read_class_index

    if meta is not None:
        return meta.get("classes")
    index = os.path.join(os.path.dirname(os.path.abspath(run_cfg.from_pretrained_params)),
                         "classes.json")
    return read_class_index(index) if os.path.exists(index) else None


def export(config):
    """Write the inference model of ``config``; returns the export report."""
    import paddle

    import program as program_builder
    from paddle_resnet import checkpoint as ckpt
    from paddle_resnet.atomic import staged_directory

    meta, state = ckpt.read_weights(config.run)
    if state is None:
        raise ConfigError("export needs --from-checkpoint or --from-pretrained-params")
    classes = _classes(config.run, meta)
    programs = program_builder.build_programs(config, training=False)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(programs.startup)
    skipped = ckpt.load_pretrained(programs.eval, state)
    if skipped:
        raise CheckpointError(f"the weights do not fit {config.model.arch} with "
                              f"{config.model.num_classes} classes: {len(skipped)} parameters "
                              f"skipped, e.g. {skipped[0]}")
    out_dir = config.inference.model_dir
    with staged_directory(out_dir) as staging:    # an earlier export survives a crash
        info = _write_inference_model(config, programs, exe, state, classes, staging)
    files = {name: os.path.getsize(os.path.join(out_dir, name)) for name in sorted(os.listdir(out_dir))}
    report = dict(info, directory=out_dir, files=files,
                  source=config.run.from_checkpoint or config.run.from_pretrained_params)
    with open(config.inference.export_log_path, "w") as handle:
        json.dump(report, handle, indent=1)
    return report


def _write_inference_model(config, programs, exe, state, classes, out_dir):
    """The model, classes.json and model.json into ``out_dir``; returns model.json's content."""
    import paddle

    import program as program_builder
    from paddle_resnet import predictor, sparsity
    from paddle_resnet.data.folder import write_class_index

    prefix = os.path.join(out_dir, predictor.MODEL_FILE.rsplit(".", 1)[0])
    image = programs.eval.global_block().var("data")
    paddle.static.save_inference_model(prefix, [image], [programs.eval_fetches["probs"]], exe,
                                       program=programs.eval)
    classes = classes or [str(i) for i in range(config.model.num_classes)]
    write_class_index(os.path.join(out_dir, predictor.CLASSES_FILE), classes)
    sparse = sparsity.sparse_parameters(state)
    info = {
        "arch": config.model.arch, "num_classes": config.model.num_classes,
        "layout": config.model.data_layout, "input_shape": program_builder.input_shape(config),
        "input": "data", "output": "probabilities (softmax)",
        "preprocess": {"resize_short": config.data.resize_short, "crop_size": config.data.crop_size,
                       "normalize_mean": list(config.data.normalize_mean),
                       "normalize_std": list(config.data.normalize_std)},
        "sparse_2to4": sparse,
    }
    with open(os.path.join(out_dir, predictor.INFO_FILE), "w") as handle:
        json.dump(info, handle, indent=1)
    if sparse:
        sparsity.check_inference_model(out_dir, sparse)
    return info


def export_and_describe(config):
    report = export(config)
    sizes = ", ".join(f"{name} {size / 1e6:.1f} MB" for name, size in report["files"].items())
    print(f"exported {report['arch']} ({report['layout']} {report['input_shape']}) "
          f"to {report['directory']}: {sizes}")


def main(argv=None):
    return main_with(__doc__.splitlines()[0], export_and_describe, argv, inference=True)


if __name__ == "__main__":
    sys.exit(main())
