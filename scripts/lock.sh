#!/usr/bin/env bash
# Record the exact package versions of the tested environments as pip constraints
# (constraints/paddle-VERSION.txt); scripts/setup.sh installs within them, so a fresh
# machine gets the versions the README's figures and the tests came from. Run after
# changing requirements*.txt and re-running the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
for venv in .venv .venv-paddle3; do
  [ -x "$venv/bin/python" ] || continue
  version=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("paddlepaddle"))')
  # torch is a local +cpu build from PyTorch's own index (requirements-tools.txt), not PyPI.
  { echo "# pip freeze of $venv (Paddle $version), written by scripts/lock.sh"
    "$venv/bin/python" -m pip freeze --exclude-editable | grep -v -i -E '^(torch|pip|setuptools|wheel)==' ; } \
    > "constraints/paddle-$version.txt"
  echo "wrote constraints/paddle-$version.txt"
done
