#!/usr/bin/env bash
# The test suite: set up, run pytest on the CPU with Paddle 2.6.2 (the pinned
# version), then the same suite with Paddle 3.3.1 in its legacy static IR
# (.venv-paddle3; SKIP_PADDLE3=1 skips it). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest tests "$@"
if [ "${SKIP_PADDLE3:-0}" != 1 ]; then
  echo "== the same suite on Paddle 3.3.1 (legacy static IR)"
  VENV=.venv-paddle3 PADDLE_VERSION=3.3.1 bash scripts/setup.sh
  .venv-paddle3/bin/python -m pytest tests "$@"
fi
