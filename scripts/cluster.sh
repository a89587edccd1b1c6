#!/usr/bin/env bash
# A local three-node cairn cluster on 127.0.0.1, in the foreground: n1 on
# client port 2379 / peer 2380, n2 on 22379/22380, n3 on 32379/32380 (the
# ports of etcd's Procfile), data in ./cluster.cairn/n1..n3 (kept between
# runs). Each node's output is prefixed with its name; Ctrl-C (or any node
# exiting) stops all three.
#
#   bash scripts/cluster.sh [extra cairn flags for every node]
#   etcdctl --endpoints=127.0.0.1:2379 put k v
#   etcdctl --endpoints=127.0.0.1:22379 get k
#
# Without CAIRN it first installs the packages and builds build/cairn, as
# scripts/run.sh does, so it works on a fresh machine. CAIRN: a binary to use
# instead. CAIRN_CLUSTER_PORTS: six ports, client and peer of n1, n2, n3
# (default "2379 2380 22379 22380 32379 32380").
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${CAIRN:-}" ]; then
    bash scripts/deps.sh
    cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build build -j"$(nproc)" --target cairn
fi
cairn=${CAIRN:-build/cairn}
read -r -a ports <<< "${CAIRN_CLUSTER_PORTS:-2379 2380 22379 22380 32379 32380}"
if [ "${#ports[@]}" -ne 6 ]; then
    echo "cluster.sh: CAIRN_CLUSTER_PORTS needs six ports, got ${#ports[@]}" >&2
    exit 2
fi
if [ ! -x "$cairn" ]; then
    echo "cluster.sh: no cairn binary at $cairn (build it, or set CAIRN)" >&2
    exit 2
fi

names=(n1 n2 n3)
initial=""
for i in 0 1 2; do
    initial+="${initial:+,}${names[$i]}=http://127.0.0.1:${ports[$((2 * i + 1))]}"
done

pids=()
stopping=""
stop() {
    stopping=1
    trap - INT TERM EXIT
    for pid in "${pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    echo "cluster.sh: stopped"
}
trap stop INT TERM EXIT

mkdir -p cluster.cairn
for i in 0 1 2; do
    name=${names[$i]}
    client="http://127.0.0.1:${ports[$((2 * i))]}"
    peer="http://127.0.0.1:${ports[$((2 * i + 1))]}"
    "$cairn" --name "$name" --data-dir "cluster.cairn/$name" \
        --listen-client-urls "$client" --advertise-client-urls "$client" \
        --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
        --initial-cluster "$initial" --initial-cluster-token cairn-local-cluster \
        "$@" > >(sed -u "s/^/$name | /") 2>&1 &
    pids+=("$!")
    echo "cluster.sh: $name pid $! client $client peer $peer"
done

# Until Ctrl-C, or until one node exits (then the others are stopped too).
wait -n "${pids[@]}" || true
[ -n "$stopping" ] || echo "cluster.sh: a node exited; stopping the others"
