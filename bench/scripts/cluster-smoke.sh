#!/usr/bin/env bash
# cluster-smoke.sh CAIRN LOADGEN: the ctest cluster_bench_smoke. Runs the
# cluster part's driver (bench/scripts/cluster_bench.py) in its smallest
# form, figures b (cut and heal), d (wire bytes, cairnpb.Replication/
# ChangeBytes) and g (WaitReplicated latency, 20 samples a setting), on one
# 3-node cairn and one 3-node etcd cluster whose peer links go through
# netproxy, and checks that every figure came out, that the cut behaves as
# each system must (cairn's cut-off node keeps answering, etcd's minority
# member does not), that no WaitReplicated failed on the connected cluster,
# and that with 10 ms links a put takes at least one round trip (20 ms) to
# be held by a peer in both systems. About a minute and a half; only its
# own processes.
set -euo pipefail
CAIRN=${1:?usage: cluster-smoke.sh CAIRN LOADGEN}
LOADGEN=${2:?usage: cluster-smoke.sh CAIRN LOADGEN}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$(mktemp -d "${TMPDIR:-/tmp}/cluster-smoke.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
timeout 260 /usr/bin/python3 "$HERE/cluster_bench.py" --cairn "$CAIRN" --etcd "$(command -v etcd)" \
  --loadgen "$LOADGEN" --out "$OUT" --quick --reps 1 --sizes 3 --figures bdg --keys 500 \
  --cut-s 2 --cut-post-s 2 --cut-rate 200 --part-changes 100 --wait-samples 20
/usr/bin/python3 - "$OUT" <<'PY'
import os, sys
d = sys.argv[1]
v = {}
for line in open(os.path.join(d, "raw.tsv")):
    f, s, _, x = line.rstrip("\n").split("\t")
    v[(f, s)] = float(x)
bad = []
for key in [("cl-cut.success_pct", "etcd"), ("cl-cut.success_pct", "cairn"),
            ("cl-cut.heal_s", "cairn"), ("cl-bytes-push.ratio", "etcd"),
            ("cl-bytes-push.ratio", "cairn"), ("cl-bytes-push.change_bytes", "cairn"),
            ("cl-bytes-partition.ratio", "cairn")] + [
            ("cl-wait-%s.put_p50" % c, "etcd") for c in ("0ms", "10ms")] + [
            ("cl-wait-%s-n%d.%s" % (c, n, w), "cairn") for c in ("0ms", "10ms") for n in (1, 2)
            for w in ("ack_p50", "ack_p99", "sent_p50", "sent_p99", "samples", "failed")]:
    if key not in v:
        bad.append("no %s for %s" % key)
for n in (1, 2):
    for c in ("0ms", "10ms"):
        if v.get(("cl-wait-%s-n%d.failed" % (c, n), "cairn"), 1) != 0:
            bad.append("cairn: %s WaitReplicated n=%d failed with %s links"
                       % (v.get(("cl-wait-%s-n%d.failed" % (c, n), "cairn")), n, c))
    if not v.get(("cl-wait-10ms-n%d.sent_p50" % n, "cairn"), 0) >= 20:
        bad.append("cairn: put sent -> WaitReplicated n=%d returns p50 %s ms with 10 ms links "
                   "(< one round trip)" % (n, v.get(("cl-wait-10ms-n%d.sent_p50" % n, "cairn"))))
if not v.get(("cl-wait-10ms.put_p50", "etcd"), 0) >= 20:
    bad.append("etcd: put p50 %s ms with 10 ms links (< one round trip)"
               % v.get(("cl-wait-10ms.put_p50", "etcd")))
if v.get(("cl-cut.success_pct", "cairn"), 0) < 90:
    bad.append("cairn's cut-off node answered only %s%%" % v.get(("cl-cut.success_pct", "cairn")))
if v.get(("cl-cut.success_pct", "etcd"), 100) > 50:
    bad.append("etcd's minority member answered %s%% in the cut" % v.get(("cl-cut.success_pct", "etcd")))
if not 100 < v.get(("cl-bytes-push.change_bytes", "cairn"), 0) < 1000:
    bad.append("cairn's change size %s bytes" % v.get(("cl-bytes-push.change_bytes", "cairn")))
for f in ("cluster.md", "cluster/cut.cairn.dat", "cluster/cut.etcd.dat"):
    if not os.path.exists(os.path.join(d, f)):
        bad.append("no " + f)
print("\n".join("cluster-smoke: FAIL: " + b for b in bad) or "cluster-smoke: all checks passed")
sys.exit(1 if bad else 0)
PY
