#!/usr/bin/env bash
# The serving environment, .venv-serve: paddle-resnet-serve (KServe 0.21's ModelServer) on
# Paddle 3.3.1's CPU build, OpenVINO and ONNX Runtime, with tritonclient for the clients that
# test and measure it (requirements-serve.txt, pinned by constraints/serve.txt). Not in .venv:
# KServe 0.21 needs protobuf >= 6.33, Paddle 2.6 a protobuf 4. No DALI and no training
# requirements: the server imports neither. Idempotent, and one at a time: it holds
# .venv-serve.lock while it installs, and tests/test_serve.py waits on that lock (scripts/
# test.sh runs this in the background beside the suite).
#   bash scripts/setup_serve.sh      then: .venv-serve/bin/paddle-resnet-serve --inference-dir DIR
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-serve}
exec 9> "$VENV.lock"
flock 9
source scripts/installer.sh
make_venv "$VENV"
stamp=$VENV/.installed
wanted=$(cat requirements-serve.txt constraints/serve.txt pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  echo "setup_serve: installing KServe, Paddle 3.3.1 and OpenVINO into $VENV"
  install_into "$VENV" -r requirements-serve.txt -c constraints/serve.txt
  # the package without its requirements.txt (DALI, Paddle 2.6's protobuf): what the server
  # needs of them is in requirements-serve.txt
  install_into "$VENV" --no-deps -e .
  echo "$wanted" > "$stamp"
fi
echo "setup_serve: $("$VENV/bin/python" -c 'import paddle_resnet.commands.serve, paddle, kserve, openvino, importlib.metadata as m; print("kserve", m.version("kserve"), "paddle", paddle.__version__, "openvino", openvino.__version__.split("-")[0])')"
