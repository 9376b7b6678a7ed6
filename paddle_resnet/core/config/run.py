"""The run section: what a run does, where its files go, how it saves, logs and meets its ranks."""

from dataclasses import dataclass
from typing import Optional, Tuple

from paddle_resnet.core.bootstrap import VERBOSE_FLAG
from paddle_resnet.core.config.keys import (
    IRS,
    RUN_SCOPES,
    TOOLS,
    TRAIN_EXPORT,
    TRAIN_INFERENCE,
    at_least,
    both,
    each,
    folder,
    key,
    sqlite_file,
)
from paddle_resnet.core.optional import tracker_unusable


@dataclass(frozen=True)
class RunConfig:
    output_dir: str = key(
        "./output",
        "--output-dir",
        "folder for checkpoints, reports and the class index",
        aliases=("--checkpoint-dir",),
        resume_may_change=True,
    )
    run_scope: str = key(
        "train_eval", "--run-scope", "what to run", choices=RUN_SCOPES, resume_may_change=True
    )
    epochs: int = key(
        90,
        "--epochs",
        "number of training epochs (a resumed run may extend "
        "them: the LR schedule then spans the new total)",
        at_least(1),
        resume_may_change=True,
    )
    save_interval: int = key(
        1,
        "--save-interval",
        "save a checkpoint every N epochs",
        at_least(1),
        resume_may_change=True,
    )
    save_every_minutes: float = key(
        0.0,
        "--save-every-minutes",
        "also save a checkpoint within an epoch once M minutes have passed since the last "
        "save (the ranks agree at a step), so a node lost without warning costs at most M "
        "minutes (0: at epoch ends and on a stop only)",
        at_least(0),
        resume_may_change=True,
    )
    keep_checkpoints: int = key(
        0,
        "--keep-checkpoints",
        "keep the newest N epoch checkpoints and remove older ones, and any mid-epoch "
        "checkpoint once a later one is saved (0: keep all)",
        at_least(0),
        resume_may_change=True,
    )
    eval_interval: int = key(
        1,
        "--eval-interval",
        "validate every N epochs (and after the last)",
        at_least(1),
        resume_may_change=True,
    )
    print_interval: int = key(
        10, "--print-interval", "log every N steps", at_least(1), resume_may_change=True
    )
    report_file: Optional[str] = key(
        None,
        "--report-file",
        "JSON-lines report (default <output-dir>/report.json)",
        resume_may_change=True,
    )
    benchmark: bool = key(
        False,
        "--benchmark",
        "measure throughput only: warm-up steps, then timed steps",
        resume_may_change=True,
    )
    benchmark_steps: int = key(
        100,
        "--benchmark-steps",
        "timed steps in benchmark mode",
        at_least(1),
        resume_may_change=True,
        tools=TRAIN_INFERENCE,
    )
    benchmark_warmup_steps: int = key(
        100,
        "--benchmark-warmup-steps",
        "untimed steps in benchmark mode",
        at_least(0),
        resume_may_change=True,
        tools=TRAIN_INFERENCE,
    )
    from_checkpoint: Optional[str] = key(
        None,
        "--from-checkpoint",
        "checkpoint folder to resume from (<output-dir>/<arch>/<epoch>, or <output-dir>/<arch> for "
        "its newest), or auto: the newest checkpoint of this run in --output-dir if there is one, "
        "else a fresh start (a job restarted by its scheduler with the same command continues)",
        resume_may_change=True,
        tools=TRAIN_EXPORT,
    )
    last_epoch_of_checkpoint: Optional[str] = key(
        None,
        "--last-epoch-of-checkpoint",
        "with --from-checkpoint <output-dir>/<arch>: the "
        "epoch to resume from (auto or unset: the newest)",
        lambda v: (
            None
            if v == "auto" or (v.isdigit() and int(v) >= 1)
            else f"must be auto or an epoch >= 1, got {v!r}"
        ),
        resume_may_change=True,
        tools=TRAIN_EXPORT,
    )
    model_prefix: str = key(
        "model",
        "--model-prefix",
        "file name prefix of checkpoint parameters (<prefix>.pdparams); --from-pretrained-params "
        "FOLDER reads FOLDER/<prefix>.pdparams",
        resume_may_change=True,
        tools=TRAIN_EXPORT,
    )
    from_pretrained_params: Optional[str] = key(
        None,
        "--from-pretrained-params",
        "parameters to start from: this toolkit's .pdparams (or its prefix), a torchvision/"
        "timm state dict (.pth/.pt, .safetensors) or a PaddleClas .pdparams, recognised by "
        "content; a classifier of another class count is skipped",
        resume_may_change=True,
        tools=TRAIN_EXPORT,
    )
    trackers: Tuple[str, ...] = key(
        (),
        "--tracker",
        "experiment trackers that also get the run (rank 0's; repeatable): tensorboard "
        "(--tensorboard-log-dir), mlflow (--mlflow-tracking-uri), visualdl "
        "(--visualdl-log-dir): the report's scalars, each class's accuracy and the "
        "confusion matrix at each validation, the config as parameters, the checkpoints "
        "saved; a resumed run continues the tracker's run",
        each(tracker_unusable),
        resume_may_change=True,
        repeatable=True,
    )
    tensorboard_log_dir: Optional[str] = key(
        None,
        "--tensorboard-log-dir",
        "TensorBoard's folder with --tracker tensorboard (default <output-dir>/tensorboard; "
        "view with: tensorboard --logdir DIR)",
        folder,
        resume_may_change=True,
    )
    mlflow_tracking_uri: Optional[str] = key(
        None,
        "--mlflow-tracking-uri",
        "MLflow's tracking URI with --tracker mlflow (a server's http://HOST:PORT, a "
        "database); default MLFLOW_TRACKING_URI, else a local store without a server, "
        "sqlite:///<output-dir>/mlflow.db (view with: mlflow ui --backend-store-uri URI)",
        sqlite_file,
        resume_may_change=True,
    )
    visualdl_log_dir: Optional[str] = key(
        None,
        "--visualdl-log-dir",
        "VisualDL's folder; giving it turns the visualdl tracker on (default with "
        "--tracker visualdl: <output-dir>/visualdl; view with: visualdl --logdir DIR)",
        both(lambda _: tracker_unusable("visualdl"), folder),
        resume_may_change=True,
    )
    seed: int = key(42, "--seed", "random seed of parameter initialisation")
    cpu_onednn: Optional[bool] = key(
        None,
        "--cpu-onednn",
        "oneDNN kernels for the convolutions and ReLUs of CPU training (--no-cpu-onednn: Paddle's "
        "plain kernels; unset: whichever trains this model and shape faster on this machine, "
        "measured once and kept in ~/.cache/paddle-resnet; no effect on GPUs)",
        resume_may_change=True,
    )
    cpu_fused_bn: bool = key(
        False,
        "--cpu-fused-bn",
        "train each batch norm with the addition and ReLU after it as one of the toolkit's own "
        "CPU kernels (built on first use with g++; fp32; on PIR with Paddle's plain "
        "convolutions; no effect on GPUs)",
        resume_may_change=True,
    )
    cpu_affinity: bool = key(
        True,
        "--enable-cpu-affinity",
        "pin each GPU rank to the CPU cores nvidia-smi topo -m gives its "
        "GPU (no effect without GPUs)",
        resume_may_change=True,
    )
    profile_start_step: Optional[int] = key(
        None,
        "--profile-start-step",
        "profile training steps from this global step (Paddle profiler trace in "
        "<output-dir>/profile; NVTX ranges and the CUDA profiler window for nsys on GPUs)",
        at_least(0),
        resume_may_change=True,
    )
    profile_stop_step: Optional[int] = key(
        None,
        "--profile-stop-step",
        "first step no longer profiled (default: start + 10)",
        at_least(1),
        resume_may_change=True,
    )
    start_timeout: int = key(
        1800,
        "--start-timeout",
        "ranks of paddle.distributed.launch: seconds the start may take (everything "
        "before the first step: the ranks' rendezvous, data check, programs, weights); a "
        "rank past it ends with one line naming its phase (0: no deadline)",
        at_least(0),
        resume_may_change=True,
    )
    collective_timeout: int = key(
        1800,
        "--collective-timeout",
        "multi-rank jobs: seconds a rank may go without "
        "progress (a step, an evaluation batch) before it ends the job, naming the stuck "
        "rank (NCCL's customary 30 minutes; longer than any checkpoint save)",
        at_least(1),
        resume_may_change=True,
    )
    sync_bn: bool = key(
        False,
        "--sync-bn",
        "batch-norm statistics over all ranks (Fleet sync_batch_norm; GPUs only)",
    )
    ir: Optional[str] = key(
        None,
        "--ir",
        "Paddle's static graph to build on: legacy (Fleet's AMP, ASP, QAT and data parallelism; "
        "the only one on Paddle 2.6) or pir (Paddle 3.x; the toolkit's own 2:4 masks, int8 through "
        "model.onnx; exports inference.json); unset: pir on Paddle 3 but for GPUs, multi-process "
        "CPU jobs and legacy-only options, each said in one line",
        choices=IRS,
        resume_may_change=True,
        tools=TRAIN_EXPORT,
    )
    verbose: bool = key(
        False,
        VERBOSE_FLAG,
        "show Paddle's own log lines, warnings and prints (hidden by default)",
        resume_may_change=True,
        tools=TOOLS,
    )
