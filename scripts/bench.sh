#!/usr/bin/env bash
# Installs dependencies (and gnuplot for the plots), builds cairn and its load
# generator, and runs every benchmark beside a fresh etcd 3.4 (about 25
# minutes on 2 cores). Arguments go to bench/scripts/bench-all.sh, e.g.
# --quick for a few-minute smoke run. Results: bench/results/LATEST.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
if ! command -v gnuplot >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends gnuplot-nox
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target cairn cairn-loadgen
exec bench/scripts/bench-all.sh --build build "$@"
