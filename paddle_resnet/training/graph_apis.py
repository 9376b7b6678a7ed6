"""The Paddle APIs the program builders of this folder call, declared beside them and
built as tiny static graphs on each IR: the doctor (``commands/doctor.py``) names a
Paddle that moved one of them out of an IR's reach before a long job starts."""

import paddle

from paddle_resnet.core import paddle_internals, preflight

# Each as a tiny static graph over an image batch ``x`` and its labels ``y`` (APIs moved
# to C++ bindings take no legacy variable).
GRAPH_APIS = {
    "paddle.static.data": lambda x, y: x,
    "paddle.nn.Conv2D": lambda x, y: paddle.nn.Conv2D(3, 4, 3, padding=1)(x),
    "paddle.nn.BatchNorm2D": lambda x, y: paddle.nn.BatchNorm2D(3)(x),
    "paddle.nn.ReLU": lambda x, y: paddle.nn.ReLU()(x),
    "paddle.nn.MaxPool2D": lambda x, y: paddle.nn.MaxPool2D(2)(x),
    "paddle.nn.AdaptiveAvgPool2D": lambda x, y: paddle.nn.AdaptiveAvgPool2D(1)(x),
    "paddle.flatten": lambda x, y: paddle.flatten(x, 1),
    "paddle.nn.Linear": lambda x, y: paddle.nn.Linear(48, 4)(paddle.flatten(x, 1)),
    "paddle.cast": lambda x, y: paddle.cast(x, "float32"),
    "paddle.flip": lambda x, y: paddle.flip(x, [0]),
    "paddle.gather": lambda x, y: paddle.gather(paddle.reshape(x, [-1]), paddle.reshape(y, [-1])),
    "paddle.reshape": lambda x, y: paddle.reshape(x, [-1, 48]),
    "paddle.nn.functional.one_hot": lambda x, y: paddle.nn.functional.one_hot(y, 4),
    "paddle.nn.functional.label_smooth": lambda x, y: paddle.nn.functional.label_smooth(
        paddle.reshape(paddle.nn.functional.one_hot(y, 4), [-1, 4]), epsilon=0.1
    ),
    "paddle.nn.functional.cross_entropy": lambda x, y: paddle.nn.functional.cross_entropy(
        paddle.reshape(x, [-1, 48])[:, :4], y
    ),
    "paddle.nn.functional.softmax": lambda x, y: paddle.nn.functional.softmax(x),
    "paddle.topk": lambda x, y: paddle.topk(paddle.reshape(x, [-1, 48]), k=2)[1],
    "paddle.mean": lambda x, y: paddle.mean(x),
    "paddle.metric.accuracy": lambda x, y: paddle.metric.accuracy(
        input=paddle.reshape(x, [-1, 48]), label=y, k=1
    ),
    "paddle.assign": lambda x, y: paddle.assign(x * 2.0, output=x),
}


def mixed_precision_step(x, y):
    """PIR's AMP as the builders use it (pir_strategies.py), in bf16: fp16 builds on GPU
    builds only."""
    conv, optimizer = paddle.amp.decorate(
        models=paddle.nn.Conv2D(3, 4, 1),
        optimizers=paddle.optimizer.Momentum(0.1),
        level="O1",
        dtype="bfloat16",
    )
    with paddle.amp.auto_cast(level="O1", dtype="bfloat16"):
        out = conv(x)
    scaler = paddle.amp.GradScaler(init_loss_scaling=2.0, use_dynamic_loss_scaling=False)
    scaler.minimize(optimizer, paddle.mean(out.astype("float32")) * 2.0)


# Built on PIR only (on the legacy IR Fleet's AMP rewrites the built program instead).
PIR_GRAPH_APIS = {"paddle.amp (auto_cast, decorate, GradScaler)": mixed_precision_step}
# The newest Paddle on which every one of them built, per IR (this project's CI).
LAST_KNOWN_GOOD = {"legacy": "3.3.1", "pir": "3.3.1"}


def graph_apis(ir):
    return dict(GRAPH_APIS, **(PIR_GRAPH_APIS if ir == "pir" else {}))


def graph_api_failures(ir):
    """{API: its error} of the GRAPH_APIS (and on PIR the PIR_GRAPH_APIS) that do not
    build on ``ir`` ("legacy", "pir")."""
    failures = {}
    with paddle_internals.static_ir(ir == "pir"):
        paddle.enable_static()
        for name, build in graph_apis(ir).items():
            main, startup = paddle.static.Program(), paddle.static.Program()
            try:
                with paddle.static.program_guard(main, startup):
                    x = paddle.static.data("x", [None, 3, 4, 4], "float32")
                    y = paddle.static.data("y", [None, 1], "int64")
                    build(x, y)
            except Exception as err:  # any refusal names the API
                failures[name] = str(err).strip().splitlines()[-1][:160]
    return failures


def graph_findings():
    """The preflight's findings (``core/preflight.py``): per IR, whether they all build."""
    for ir in ("legacy", "pir") if paddle_internals.PADDLE3 else ("legacy",):
        failures = graph_api_failures(ir)
        if failures:
            name, error = next(iter(failures.items()))
            found = f"{len(failures)} of {len(graph_apis(ir))} APIs fail, first {name}: {error}"
            meaning = (
                f"--ir {ir} cannot build the toolkit's programs on this Paddle "
                f"(last known good: {LAST_KNOWN_GOOD[ir]})"
            )
        else:
            found = f"the {len(graph_apis(ir))} Paddle APIs the builders use build"
            meaning = f"--ir {ir} programs can be built"
        yield preflight.Finding(
            f"static graph ({ir} IR)", found, meaning, provides=ir, met=not failures
        )
