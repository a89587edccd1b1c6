#!/usr/bin/env bash
# Installs dependencies, builds cairn and runs one node with etcd's defaults
# (data in ./default.cairn, clients on 127.0.0.1:2379). Extra arguments are
# passed to cairn (see build/cairn --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target cairn
exec build/cairn "$@"
