#!/usr/bin/env bash
# Set up everything on a fresh machine: a virtual environment in .venv with Paddle
# (GPU build if an NVIDIA GPU is present), DALI and the Python dependencies, and
# the Fashion-MNIST images the demo and tests use. Re-running is fast and harmless.
set -euo pipefail
cd "$(dirname "$0")/.."

# PADDLE_VERSION and VENV select another Paddle in another environment (the test suite
# uses 3.3.1 in .venv-paddle3; PyPI has Paddle 3.x for the CPU only). PADDLE_BUILD picks
# the build: auto (the GPU build where nvidia-smi finds a GPU), gpu or cpu; the test suite
# runs the GPU build on CPU-only machines too, in .venv-gpu.
PADDLE_VERSION=${PADDLE_VERSION:-2.6.2}
VENV=${VENV:-.venv}
PADDLE_BUILD=${PADDLE_BUILD:-auto}
if [ "$PADDLE_BUILD" = auto ]; then
  PADDLE_BUILD=cpu
  if [[ "$PADDLE_VERSION" == 2.* ]] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    PADDLE_BUILD=gpu
  fi
fi
case "$PADDLE_BUILD" in
  gpu) paddle_package="paddlepaddle-gpu==${PADDLE_VERSION}" ;;
  cpu) paddle_package="paddlepaddle==${PADDLE_VERSION}" ;;
  *) echo "setup: PADDLE_BUILD must be auto, gpu or cpu, not $PADDLE_BUILD" >&2; exit 2 ;;
esac

# One apt-get at a time: the test command sets up its environments side by side.
# Debian's tcmalloc: training runs with it preloaded (paddle_resnet/core/bootstrap.py,
# 1.07-1.16x on a CPU); without it training uses the C library's allocator.
(
  flock 9
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    echo "setup: installing the Debian package dataset-fashion-mnist"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq dataset-fashion-mnist >/dev/null
  fi
  if ! ls /usr/lib/*/libtcmalloc_minimal.so.4 >/dev/null 2>&1; then
    echo "setup: installing the Debian package libtcmalloc-minimal4"
    { $sudo_cmd apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq libtcmalloc-minimal4 >/dev/null; } \
      || echo "setup: libtcmalloc-minimal4 could not be installed: training uses the C library's allocator"
  fi
  # g++: the toolkit's fused CPU training kernels are built with it on first use
  # (paddle_resnet/training/cpu_ops); without it training uses Paddle's kernels.
  if ! command -v g++ >/dev/null 2>&1; then
    echo "setup: installing the Debian package g++"
    { $sudo_cmd apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq g++ >/dev/null; } \
      || echo "setup: g++ could not be installed: training uses Paddle's kernels"
  fi
) 9> "${TMPDIR:-/tmp}/paddle-resnet-setup.lock"

source scripts/installer.sh
make_venv "$VENV"
stamp=$VENV/.installed
# The exact versions the tests and the README's figures came from (scripts/lock.sh).
# Another PADDLE_VERSION installs unconstrained.
constraints=constraints/paddle-${PADDLE_VERSION}.txt
[ -f "$constraints" ] || constraints=/dev/null
wanted="$paddle_package $(cat requirements.txt requirements-test.txt pyproject.toml "$constraints" | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  echo "setup: installing $paddle_package and requirements into $VENV"
  # The project itself is installed editable: the library, and the entry points as
  # modules, importable from scripts/ and tests/ without touching sys.path.
  install_into "$VENV" "$paddle_package" -r requirements-test.txt -c "$constraints" -e .
  # foolbox ships 20 real ImageNet validation JPEGs (tests use them); its own
  # dependencies are not needed.
  install_into "$VENV" --no-deps foolbox==3.3.4
  echo "$wanted" > "$stamp"
fi
echo "setup: $("$VENV/bin/python" -c 'import paddle_resnet, paddle, nvidia.dali as d; print("paddle", paddle.__version__, "dali", d.__version__)')"
