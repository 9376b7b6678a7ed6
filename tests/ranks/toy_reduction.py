"""A BN-free toy program trained through the toolkit's Fleet collective path, to check
the gradient reduction itself: each rank gets its own slice of every global batch.

    python tests/ranks/toy_reduction.py OUT [--amp] [--pir]               # one process
    python -m paddle.distributed.launch --nproc_per_node 2 tests/ranks/toy_reduction.py OUT

With --pir the program is built on PIR and reduced by the toolkit's own all-reduce
(``pir_strategies.minimize``) instead of Fleet's.

Writes OUT.<rank>.npz with the parameters after 3 SGD steps and the op types of the
train program. Averaged gradients make every rank equal the one-process run on the
whole batch; summed ones would double its steps; none would leave the ranks apart.
With --amp (dynamic loss scaling) the second step's last image is infinite: it lands
on the last rank only, and every rank must skip that step, as the one process does.
"""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import sys

import numpy as np
import paddle
from paddle.distributed import fleet

from paddle_resnet.core import devices
from paddle_resnet.core.config import build_config
from paddle_resnet.training import distributed, ir, pir_strategies
from paddle_resnet.training import programs as program

GLOBAL_BATCH, STEPS = 8, 3


def main(out, amp, pir):
    config = build_config(
        {
            "amp.enabled": amp,
            "amp.scale_loss": 128.0,
            "amp.use_dynamic_loss_scaling": amp,
            "run.ir": "pir" if pir else "legacy",
        }
    )
    rank, world_size = distributed.init_fleet()
    with ir.selected(config):
        train(out, config, rank, world_size)


def train(out, config, rank, world_size):
    paddle.enable_static()
    main_program, startup = paddle.static.Program(), paddle.static.Program()
    ir.seed(main_program, startup, 7)
    with paddle.static.program_guard(main_program, startup):
        x = paddle.static.data("x", [None, 6], "float32")
        y = paddle.static.data("y", [None, 1], "float32")
        prediction = paddle.nn.Linear(6, 1)(x)
        loss = paddle.mean(paddle.square(prediction - y))
        if ir.is_pir(config):
            pir_strategies.minimize(config, paddle.optimizer.SGD(0.05), loss, kept_dense=[])
        else:
            strategy = program.distributed_strategy(config, on_gpu=False)
            optimizer = fleet.distributed_optimizer(paddle.optimizer.SGD(0.05), strategy=strategy)
            with distributed.collective_rewrite(main_program, startup):
                optimizer.minimize(loss, startup)
    exe = paddle.static.Executor(devices.device()[0])  # CPU ranks over gloo, or GPUs
    exe.run(startup)
    rng = np.random.RandomState(0)
    share = GLOBAL_BATCH // world_size
    for step in range(STEPS):
        xs = rng.standard_normal((GLOBAL_BATCH, 6)).astype("float32")
        ys = rng.standard_normal((GLOBAL_BATCH, 1)).astype("float32")
        if config.amp.enabled and step == 1:
            xs[-1] = np.inf
        mine = slice(rank * share, (rank + 1) * share)
        exe.run(main_program, feed={"x": xs[mine], "y": ys[mine]}, fetch_list=[loss])
    scope = paddle.static.global_scope()
    params = {
        p.name: np.array(scope.find_var(p.name).get_tensor()) for p in ir.parameters(main_program)
    }
    np.savez(f"{out}.{rank}.npz", ops=np.array(ir.op_sequence(main_program)), **params)


if __name__ == "__main__":
    main(sys.argv[1], "--amp" in sys.argv[2:], "--pir" in sys.argv[2:])
