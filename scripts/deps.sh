#!/usr/bin/env bash
# Installs every Debian package cairn needs to build, test and fuzz; with
# --bench also what only the benchmarks need (scripts/bench.sh): gnuplot for
# the plots, Go and etcd's Go libraries to build etcd's own load generator
# (bench/scripts/build-etcd-benchmark.sh).
# Runs as root (CI, a fresh machine) or through sudo; skips what is present.
set -euo pipefail
PKGS=(
  build-essential cmake pkg-config clang libclang-rt-14-dev
  libsodium-dev check libsubunit-dev libleveldb-dev libsnappy-dev
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
  libjansson-dev libjemalloc-dev libyaml-dev libssl-dev openssl
  etcd-server etcd-client
  python3 python3-grpcio python3-protobuf python3-h2 python3-prometheus-client python3-etcd3
)
if [ "${1:-}" = --bench ]; then
  PKGS+=(gnuplot-nox golang-go golang-etcd-server-dev)
fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
