"""train.py --benchmark: training throughput and step-time percentiles instead of
epochs, reported as the run's summary."""

import itertools

from paddle_resnet.core.metrics import latency_summary, time_steps
from paddle_resnet.training.loop import mixup_weights, train_step


def benchmark(session, train_split):
    """Training throughput and step-time percentiles over ``benchmark_steps`` steps after
    ``benchmark_warmup_steps``; data loading counts in the step time."""
    config, world_size = session.config, session.world_size
    batches = itertools.chain.from_iterable(
        session.loader(train_split, training=True, epoch=epoch) for epoch in itertools.count()
    )
    weights = mixup_weights(config.loss.mixup_alpha, config.data.seed, 0)
    run_cfg = config.run
    seconds = time_steps(
        lambda: train_step(
            session.exe, session.programs, next(batches), next(weights), session.class_feeds(1)
        ),
        run_cfg.benchmark_warmup_steps,
        run_cfg.benchmark_steps,
    )
    summary = latency_summary(config.data.batch_size * world_size, seconds)
    result = {
        "train.ips": summary["ips"],
        "train.batch_size": config.data.batch_size,
        "train.step_ms_mean": summary["latency_avg"],
        "train.step_ms_p50": summary["latency_p50"],
        "train.step_ms_p90": summary["latency_p90"],
        "world_size": world_size,
        "benchmark_steps": run_cfg.benchmark_steps,
        "benchmark_warmup_steps": run_cfg.benchmark_warmup_steps,
    }
    session.report.log("BENCHMARK", result, kind="SUMMARY")
    return result
