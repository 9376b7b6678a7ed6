#!/usr/bin/env bash
# etcd for paddle.distributed.launch's elastic mode (--master etcd://..., the only mode in
# which the launcher relaunches failed ranks; tests/test_data_parallel.py shows it): the
# server from Debian's etcd-server, and the launcher's client, etcd3, in a folder of its
# own (.etcd3-site), given to the launcher alone through PYTHONPATH. Not in the venv:
# etcd3 0.12 is an old client (its generated protobuf code needs
# PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python beside Paddle's protobuf 4) and grpcio
# 1.85 segfaults when imported after Paddle 2.6.2 (1.62.3 does not). Idempotent; without
# root (or sudo) and etcd, one line, and the test skips.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v etcd > /dev/null 2>&1; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo -n"
  if ! { $sudo_cmd apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq etcd-server; } > /dev/null 2>&1; then
    echo "setup_etcd: could not install Debian's etcd-server: the elastic-launcher test will skip"
    exit 0
  fi
  # The package starts a system etcd on 2379; the test runs its own on free ports.
  { systemctl stop etcd || service etcd stop || pkill -x etcd; } > /dev/null 2>&1
fi
target=.etcd3-site
if [ ! -f "$target/.installed" ]; then
  source scripts/installer.sh
  install_into .venv --no-deps --target "$target" \
    etcd3==0.12.0 tenacity==9.2.1 grpcio==1.62.3 && touch "$target/.installed"
fi
echo "setup_etcd: $(etcd --version | head -1), etcd3 in $target"
