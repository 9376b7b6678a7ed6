"""Show the static programs train.py would build for a config, without running them:
ops by type, casts, parameters, multiply-accumulates per image, the strategies applied.

    python program.py --config resnet50_paddle_90e --amp
    python program.py --config resnet18_demo --print-program eval     # the program text
    python program.py --config resnet18_demo --json programs.json

Takes train.py's flags (no data is read) and two of its own: --print-program
{train,eval} and --json FILE.
"""

import argparse
import json
import sys

from paddle_resnet.commands import REGISTRY_CHOICES
from paddle_resnet.core import bootstrap
from paddle_resnet.core.cli import main_with


def show(config, print_program=None, json_path=None):
    from paddle_resnet.training import describe, ir, programs

    training = config.run.run_scope != "eval_only"
    with ir.selected(config):
        built = programs.build_programs(
            config, steps_per_epoch=1, global_batch=config.data.batch_size, training=training
        )
        description = describe.describe(built)
    if print_program:
        print(getattr(built, print_program))
    for name in ("train", "eval"):
        if name in description:
            d = description[name]
            top = ", ".join(f"{t} {n}" for t, n in list(d["ops_by_type"].items())[:8])
            print(f"{name} program: {d['ops']} ops ({top}, ...)")
            print(f"  casts {d['casts']}, fused ops {d['fused_ops'] or 'none'}")
            print(f"  parameters {d['parameters']:,} in {d['parameter_tensors']} tensors")
    print(f"multiply-accumulates per image: {description['eval']['macs_per_image'] / 1e9:.3f} G")
    if "strategies" in description:
        applied = [name for name, on in description["strategies"].items() if on]
        print(f"strategies applied: {', '.join(applied) or 'none'}")
    if json_path:
        with open(json_path, "w") as handle:
            json.dump(description, handle, indent=1)
    return description


def main(argv=None):
    bootstrap.prepare_process(argv)
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--print-program", choices=("train", "eval"))
    parser.add_argument("--json")
    extra, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    action = lambda config: show(config, extra.print_program, extra.json)  # noqa: E731
    return main_with("train", __doc__.splitlines()[0], action, rest, REGISTRY_CHOICES)


if __name__ == "__main__":
    sys.exit(main())
