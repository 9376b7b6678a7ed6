#!/usr/bin/env bash
# NNCF (OpenVINO's quantizer, the int8 peer of scripts/benchmark_inference.py and of
# tests/test_nncf.py) in a folder of its own, not in the venv: pip would upgrade numpy to
# 2.x for it, and Paddle 2.6 needs numpy 1.26. NNCF 3.4 runs with the venv's numpy 1.26,
# so the numpy it brings is deleted. The benchmark finds the folder with --nncf-site
# (default: .nncf-site). Installs nothing when that NNCF is there already (the test
# command calls it every time).
#   scripts/setup_nncf.sh [target folder]
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-.nncf-site}
VENV=${VENV:-.venv}
version=3.4.0
check() {
  PYTHONPATH="$target" "$VENV/bin/python" -c "import nncf, numpy; assert nncf.__version__ == '$version'; print(f'nncf {nncf.__version__} (numpy {numpy.__version__}) in $target')"
}
if [ -d "$target/nncf-$version.dist-info" ] && [ ! -d "$target/numpy" ]; then
  exit 0
fi
# --no-warn-conflicts: pip would compare the numpy 2 it puts in $target with the venv's
source scripts/installer.sh
install_into "$VENV" --target "$target" "nncf==$version"
rm -rf "$target"/numpy "$target"/numpy-* "$target"/numpy.libs "$target"/bin/f2py "$target"/bin/numpy-config
check
