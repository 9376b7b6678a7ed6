#!/usr/bin/env bash
# Slurm, munge and shellcheck for tests/test_slurm.py, which starts a Slurm of its own on
# this host (Debian's slurm-wlm 22.05; docs/guide.md, "Slurm on one host") and lints the batch scripts
# of scripts/cluster/slurm. Installs nothing when they are there. Without root or sudo, or
# when apt-get fails, it says so in one line and succeeds: the Slurm tests then skip,
# naming what is missing.
set -uo pipefail
PATH=$PATH:/usr/sbin:/sbin
if command -v slurmctld > /dev/null && command -v munged > /dev/null && command -v shellcheck > /dev/null; then
  exit 0
fi
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo > /dev/null || ! sudo -n true 2> /dev/null; then
    echo "setup_slurm: slurm-wlm, munge or shellcheck missing and no root or sudo: the Slurm tests will skip"
    exit 0
  fi
  sudo_cmd=(sudo -n)
fi
install() {
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge shellcheck > /dev/null
}
echo "setup_slurm: installing the Debian packages slurm-wlm, munge and shellcheck"
if ! install && ! { "${sudo_cmd[@]}" apt-get update -qq && install; }; then
  echo "setup_slurm: apt-get could not install slurm-wlm, munge and shellcheck: the Slurm tests will skip"
fi
exit 0
