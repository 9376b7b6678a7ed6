"""Show the static programs train.py would build for a config (ops, casts, parameters,
multiply-accumulates, strategies applied; the program text with --print-program).

    python program.py --config resnet18_demo
    python program.py --config resnet50_paddle_90e --amp --print-program train

An entry point only: what it does is paddle_resnet/commands/program.py.
"""

import sys

from paddle_resnet.commands import program

if __name__ == "__main__":
    sys.exit(program.main())
