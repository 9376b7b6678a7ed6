"""The process environment Paddle reads once, when it is first imported, and the
console's quiet: Paddle's own chatter (glog lines, fleet prints, deprecation warnings)
is hidden unless the command line says ``--verbose`` or the environment has
PADDLE_RESNET_VERBOSE=1.

Importing the package does nothing; each command, script and the test suite prepares its
process first (``prepare_process``; the training command starts itself again with
tcmalloc before that, ``preload_allocator``). Values the user set are kept.
"""

import contextlib
import io
import logging
import os
import sys
import sysconfig
import warnings

# The repository: the checkout the package runs from in an editable install.
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERBOSE_FLAG = "--verbose"
TRUE_WORDS = ("1", "true", "yes", "on", "y", "t")
FALSE_WORDS = ("0", "false", "no", "off", "n", "f")
# Whether this process shows Paddle's chatter: decided from the command line when the process
# is prepared (before Paddle loads), then from the built Config's run.verbose (cli.main_with).
_verbose = [False]
# The process that started this one, as it was when this module was first imported (before
# Paddle loads): a rank whose launcher is gone ends too (``distributed.ends_with_launcher``).
PARENT_AT_START = os.getppid()


# What ``paddle.distributed.launch`` sets for every rank it starts, Paddle 2.6 and 3.3 alike
# (controllers/collective.py, and PADDLE_LOG_DIR controllers/controller.py); it names no
# launcher process. One alone says little: PADDLE_LOG_DIR may be exported by a user or a
# profile, PADDLE_TRAINER_ENDPOINTS and PADDLE_TRAINER_ID set by hand.
LAUNCHER_VARIABLES = tuple(
    """PADDLE_LOG_DIR PADDLE_LOCAL_RANK PADDLE_GLOBAL_RANK PADDLE_LOCAL_SIZE PADDLE_TRAINER_ID
    PADDLE_CURRENT_ENDPOINT""".split()
)


def launched(environ=os.environ):
    """Whether ``paddle.distributed.launch`` started this process: all LAUNCHER_VARIABLES set."""
    return all(environ.get(name) for name in LAUNCHER_VARIABLES)


def available_cores():
    return len(os.sched_getaffinity(0))


def is_verbose(argv=None, environ=os.environ):
    """What the command line says of --verbose, as the parser will read it (the last
    occurrence wins; a following true/false word is its value), else the environment."""
    argv = sys.argv[1:] if argv is None else argv
    said = environ.get("PADDLE_RESNET_VERBOSE") == "1"
    for index, arg in enumerate(argv):
        if arg == "--no-verbose":
            said = False
        elif arg == VERBOSE_FLAG or arg.startswith(VERBOSE_FLAG + "="):
            value = arg.partition("=")[2] or (argv[index + 1] if index + 1 < len(argv) else "")
            said = value.lower() not in FALSE_WORDS
    return said


def verbose():  # whether Paddle's chatter is shown now
    return _verbose[0]


def set_verbose(value):
    _verbose[0] = bool(value)


def threads_per_process(environ=os.environ):
    """This machine's cores shared by the launcher's ranks here (PADDLE_LOCAL_SIZE), >= 1."""
    ranks_here = int(environ.get("PADDLE_LOCAL_SIZE", "1") or 1)
    return max(1, available_cores() // max(1, ranks_here))


def math_threads(environ=os.environ):
    """The math library threads: OMP_NUM_THREADS, else ``threads_per_process``."""
    value = environ.get("OMP_NUM_THREADS", "")
    return max(1, int(value)) if value.isdigit() else threads_per_process(environ)


# The rehearsal of a Paddle without the legacy IR: set to 1, every path that needs it
# refuses in one line (``paddle_internals.static_ir``, ``training/ir.py``).
PIR_ONLY_VARIABLE = "PADDLE_RESNET_PIR_ONLY"


def pir_only(environ=os.environ):
    return environ.get(PIR_ONLY_VARIABLE) == "1"


# The toolkit's training command runs with Debian's tcmalloc (libtcmalloc-minimal4,
# installed by scripts/setup.sh) preloaded, as Intel's CPU trainers run theirs: on the
# 2-core AMX Xeon, Paddle 3.3.1, training 1.07x as fast at the demo's 32 px and 1.16x at
# 224 px (ResNet-50), where jemalloc, OpenMP affinity and a larger oneDNN cache gained
# nothing or lost (scripts/benchmark_cpu_training.py --process; docs/measurements.md).
# It must be in place before the process starts: the command's first step starts it again
# with it, before Paddle loads (only the toolkit's own command; not on GPU machines, not
# measured there, whose images set LD_PRELOAD themselves).
TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc_minimal.so", "libtcmalloc.so")


def tcmalloc(environ=os.environ):
    """The first tcmalloc library where Intel's launcher (torch.backends.xeon.run_cpu) looks,
    or in Debian's multiarch folder; None without one."""
    local = os.path.expanduser("~/.local")
    prefixes = [environ.get("CONDA_PREFIX"), environ.get("VIRTUAL_ENV"), local, "/usr/local"]
    folders = [os.path.join(p, "lib") for p in prefixes if p] + ["/usr/local/lib64"]
    folders += [f"/usr/lib/{sysconfig.get_config_var('MULTIARCH')}", "/usr/lib", "/usr/lib64"]
    paths = (os.path.join(folder, name) for folder in folders for name in TCMALLOC_NAMES)
    return next((path for path in paths if os.path.exists(path)), None)


ALLOCATOR_VARIABLE = "PADDLE_RESNET_ALLOCATOR"  # "system": the C library's own
# Set in the environment the command starts itself again with: how the allocator came,
# and a guard against starting again twice (a loader that drops LD_PRELOAD).
STARTED_VARIABLE = "PADDLE_RESNET_ALLOCATOR_STARTED"
TRAINING_MODULE = "paddle_resnet.commands.train"
TRAINING_CONSOLE_SCRIPT = "paddle-resnet-train"
TOOLKIT_TRAIN_PY = os.path.join(REPOSITORY, "train.py")


def command_of(orig_argv):
    """The script or ``-m`` module a Python command line runs; "" for ``-c`` and a REPL."""
    args = iter(orig_argv[1:])
    for arg in args:
        if arg == "-m":
            return next(args, "")
        if arg == "-c":
            return ""
        if arg in ("-W", "-X"):
            next(args, None)
        elif not arg.startswith("-"):
            return arg
    return ""


def is_training_command(orig_argv):
    """Whether the command line runs the toolkit's own training command: its train.py
    (however named), console script or module; not another project's train.py."""
    command = command_of(orig_argv)
    if command == TRAINING_MODULE or os.path.basename(command) == TRAINING_CONSOLE_SCRIPT:
        return True
    return bool(command) and os.path.realpath(command) == os.path.realpath(TOOLKIT_TRAIN_PY)


def gpu_machine():
    """Whether this machine has an NVIDIA driver loaded (read without Paddle)."""
    return os.path.exists("/dev/nvidiactl")


def training_environment(environ=os.environ, library=None):
    """``environ`` with ``library`` (default ``tcmalloc``'s) preloaded; ``environ`` itself
    where it is already, is not installed, or PADDLE_RESNET_ALLOCATOR=system."""
    preloaded = environ.get("LD_PRELOAD", "")
    library = library or tcmalloc(environ)
    if (
        environ.get(ALLOCATOR_VARIABLE, "tcmalloc") == "system"
        or not library
        or library in preloaded.split(":")
        or not os.path.exists(library)
    ):
        return environ
    return {
        **environ,
        "LD_PRELOAD": ":".join(filter(None, (library, preloaded))),
        STARTED_VARIABLE: "1",
    }


def preload_allocator(environ=os.environ, orig_argv=sys.orig_argv):
    """The training command's first step: start again (same process id, arguments, open files)
    in its ``training_environment``, except where ``allocator_note`` says why not."""
    if not is_training_command(orig_argv) or not sys.executable:
        return
    chosen = environ.get(ALLOCATOR_VARIABLE)
    if chosen not in (None, "tcmalloc", "system"):
        print(
            f"error: {ALLOCATOR_VARIABLE}={chosen}: not an allocator this toolkit sets; "
            "use tcmalloc (the default) or system",
            file=sys.stderr,
        )
        raise SystemExit(2)  # errors.USER_ERROR (core/errors imports this module)
    if (
        environ.get(STARTED_VARIABLE)
        or allocator() == "tcmalloc"  # preloaded by the environment (the images)
        or (gpu_machine() and chosen != "tcmalloc")
    ):
        return
    wanted = training_environment(environ)
    if wanted is not environ:
        os.execve(sys.executable, [sys.executable, *orig_argv[1:]], wanted)


def allocator():
    """The allocator this process runs on, as the report records it: tcmalloc or system."""
    try:
        with open("/proc/self/maps") as maps:
            return "tcmalloc" if "libtcmalloc" in maps.read() else "system"
    except OSError:  # not Linux
        return "system"


def allocator_note(environ=os.environ):
    """The run's line about its allocator: which, and how it came (or why not tcmalloc)."""
    if allocator() == "tcmalloc":
        how = (
            "preloaded by the training command, which started itself again with it"
            if environ.get(STARTED_VARIABLE)
            else "preloaded by the environment (LD_PRELOAD)"
        )
        return f"allocator: tcmalloc, {how} ({ALLOCATOR_VARIABLE}=system: the C library's)"
    if environ.get(ALLOCATOR_VARIABLE) == "system":
        why = f"{ALLOCATOR_VARIABLE}=system"
    elif environ.get(STARTED_VARIABLE):
        why = "LD_PRELOAD did not reach the process started again"
    elif gpu_machine():
        why = f"a GPU machine: tcmalloc is not measured on GPUs ({ALLOCATOR_VARIABLE}=tcmalloc)"
    elif not tcmalloc(environ):
        why = "tcmalloc is not installed (apt-get install libtcmalloc-minimal4: 1.07-1.16x)"
    else:
        why = "not started as the toolkit's training command"
    return f"allocator: the C library's ({why})"


def prepare_process(argv=None):
    """Each command's, script's and the test suite's first step: the console's quiet from
    ``argv`` (default this process's), Paddle's environment, then Pillow and Paddle imported."""
    set_verbose(is_verbose(argv))
    prepare_environment(verbose=verbose())
    # Pillow before Paddle: Paddle's library exports zlib symbols that Pillow's PNG encoder
    # would otherwise bind to, and crash on (SIGSEGV in deflateReset, Pillow 13 / Paddle 2.6).
    from PIL import Image  # noqa: F401

    with paddle_chatter(verbose()):
        import paddle  # noqa: F401  (after the environment is set: it is read at import)
        from paddle.distributed.fleet.utils import log_util
    if not verbose():
        log_util.logger.setLevel(logging.ERROR)  # fleet's topology and strategy INFO lines


def prepare_environment(environ=os.environ, verbose=False):
    # Fleet's static meta-optimizers (AMP, ASP, QAT) need the legacy static IR; Paddle
    # 3.x builds PIR programs unless told otherwise (2.6 ignores the flag). A run on PIR
    # switches for its length (``paddle_internals.static_ir``).
    environ.setdefault("FLAGS_enable_pir_api", "1" if pir_only(environ) else "0")
    # MLflow 3 (--tracker mlflow) reports its use to its makers' servers unless told not
    # to: a training job contacts no one it was not pointed at (=false opts back in).
    environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # Paddle's static executor uses one math thread unless told otherwise. Under
    # paddle.distributed.launch every rank inherits OMP_NUM_THREADS=1, set by the
    # launcher's own import of Paddle when the user set none: that 1 is replaced too.
    launched = "PADDLE_LOCAL_SIZE" in environ
    if "OMP_NUM_THREADS" not in environ or (launched and environ["OMP_NUM_THREADS"] == "1"):
        environ["OMP_NUM_THREADS"] = str(threads_per_process(environ))
    if not verbose:
        environ.setdefault("GLOG_minloglevel", "2")  # Paddle's C++ log: errors only
        # Python-side warnings from inside Paddle say nothing the user can act on;
        # everyone else's still show (Python shows DeprecationWarnings only for code
        # run as __main__ anyway).
        warnings.filterwarnings("ignore", module=r"paddle(\..*)?$")


@contextlib.contextmanager
def paddle_chatter(verbose):
    """Swallow what Paddle prints to Python's stdout/stderr inside the block unless ``verbose``."""
    if verbose:
        yield
        return
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield


@contextlib.contextmanager
def native_chatter(verbose):
    """Swallow what Paddle's C++ prints to stdout/stderr inside the block (Paddle Inference's
    pass logs, which ``disable_glog_info`` leaves on) unless ``verbose``."""
    if verbose:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    with open(os.devnull, "w") as null:
        for fd in saved:
            os.dup2(null.fileno(), fd)
        try:
            yield
        finally:
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
