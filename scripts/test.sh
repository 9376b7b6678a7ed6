#!/usr/bin/env bash
# The test suite: set up, then run pytest on the CPU with Paddle 2.6.2 (the pinned
# version) and with Paddle 3.3.1 in its legacy static IR (.venv-paddle3, set up while
# the 2.6.2 tests run; SKIP_PADDLE3=1 skips it). Extra arguments go to every pytest run;
# the exit status is non-zero if any failed.
#
# Two phases. First the tests without several ranks, both versions side by side: one
# run alone keeps the two cores busy only about half the time (program building, DALI
# start-up and process launches are single-threaded), and two side by side take each
# about 10 % longer than one alone. Then the multi-rank tests (marker `ranks`), one
# version after the other, alone on the machine: ranks wait for each other at every
# all-reduce, so a rank slowed by a neighbouring process stalls its whole job; with them
# inside the side-by-side runs the suite took over 36 minutes, with kernel time five
# times user time, where each version's whole suite alone takes 7. Idle OpenMP threads
# sleep instead of spinning (KMP_BLOCKTIME, OMP_WAIT_POLICY): with two runs on two
# cores, spinning threads took a fifth of the time (one test: 60 s side by side with
# spinning, 47 s without, 45 s for one run alone).
set -euo pipefail
cd "$(dirname "$0")/.."
export KMP_BLOCKTIME=0 OMP_WAIT_POLICY=PASSIVE
bash scripts/setup.sh
venvs=(.venv)
[ "${SKIP_PADDLE3:-0}" = 1 ] || venvs+=(.venv-paddle3)
status=0

paddle3_log=""
if [ ${#venvs[@]} = 2 ]; then
  paddle3_log=$(mktemp)
  ( VENV=.venv-paddle3 PADDLE_VERSION=3.3.1 bash scripts/setup.sh &&
    .venv-paddle3/bin/python -m pytest tests -m "not ranks" "$@" ) > "$paddle3_log" 2>&1 &
  paddle3_pid=$!
fi
echo "== Paddle 2.6.2: the tests without several ranks"
.venv/bin/python -m pytest tests -m "not ranks" "$@" || status=$?
if [ -n "$paddle3_log" ]; then
  wait "$paddle3_pid" || status=$?
  echo "== Paddle 3.3.1 (legacy static IR): the tests without several ranks"
  cat "$paddle3_log"
  rm -f "$paddle3_log"
fi
for venv in "${venvs[@]}"; do
  echo "== $("$venv/bin/python" -c 'import paddle; print("Paddle", paddle.__version__)'): the multi-rank tests"
  "$venv/bin/python" -m pytest tests -m ranks "$@" || status=$?
done
exit "$status"
