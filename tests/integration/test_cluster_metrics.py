#!/usr/bin/python3
"""cairn's own metrics on a pair of real cairn processes (cluster.py's
harness), read from /metrics with the Prometheus client's parser:

- cairn_store_applied_changes_total: K puts on n1 raise origin="local" on
  n1 by exactly K and origin="remote" on n2 by exactly K (once converged),
  and nothing else on either;
- cairn_store_batch_changes: its count is cairn_store_syncs_total, its sum
  cairn_store_changes_total = local + remote, its buckets ascend to +Inf;
- cairn_store_pending_changes: 0 on both once converged;
- cairn_peer_lag_changes / _seconds: 0 both ways when converged; with n2 cut
  off (netproxy), M puts on n1 make n1's lag for n2 exactly M and its age
  grows with the wall clock while n2's lag for n1 stays 0; after the heal
  both return to 0;
- cairn_checkpoint_age_seconds / _behind_changes: the age grows while the
  node runs and the changes behind count its puts; after a restart (a clean
  close writes the checkpoint) the age starts again from the close and
  nothing is behind, then each put is one behind.

Usage: test_cluster_metrics.py --cairn build/cairn
Needs the peer transport and --experimental-peer-dial (exit 77 otherwise).
"""

import argparse
import os
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cluster as clusterlib  # noqa: E402
from verdict import check, failures, finish  # noqa: E402

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # scripts/deps.sh installs python3-prometheus-client
    text_string_to_metric_families = None

SKIP = 77
BOUND_S = 20  # every wait for replication


def scrape(c, n):
    """{(sample name, frozenset of labels): value} of node n's /metrics."""
    url = "http://%s/metrics" % c.node(n).endpoint
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def get(m, name, **labels):
    return m.get((name, frozenset(labels.items())))


def wait_for(c, n, pred, what):
    """Scrapes node n until pred(metrics) holds (bounded); the last scrape."""
    deadline = time.monotonic() + BOUND_S
    while True:
        m = scrape(c, n)
        if pred(m):
            return m
        if time.monotonic() > deadline:
            check(False, "%s within %d s" % (what, BOUND_S))
            return m
        time.sleep(0.05)


def applied(m, origin):
    return get(m, "cairn_store_applied_changes_total", origin=origin)


def lag(m, peer):
    return (get(m, "cairn_peer_lag_changes", peer=peer),
            get(m, "cairn_peer_lag_seconds", peer=peer))


def check_batches(m, name):
    count = get(m, "cairn_store_batch_changes_count")
    total = get(m, "cairn_store_batch_changes_sum")
    syncs = get(m, "cairn_store_syncs_total")
    changes = get(m, "cairn_store_changes_total")
    check(count == syncs and count > 0, "%s: batch histogram count %r = syncs %r" %
          (name, count, syncs))
    check(total == changes == applied(m, "local") + applied(m, "remote"),
          "%s: batch histogram sum %r = changes %r = local + remote" % (name, total, changes))
    les = sorted((float(dict(k[1])["le"]), v) for k, v in m.items()
                 if k[0] == "cairn_store_batch_changes_bucket")
    check(les and les[-1][0] == float("inf") and les[-1][1] == count and
          all(a[1] <= b[1] for a, b in zip(les, les[1:])),
          "%s: batch buckets ascend to +Inf = count: %r" % (name, les))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", required=True)
    a = ap.parse_args()
    if "--listen-peer-urls" not in clusterlib.help_text(a.cairn):
        print("SKIP: no peer transport")
        return SKIP
    if text_string_to_metric_families is None:
        print("python3-prometheus-client is not installed")
        return 1
    with clusterlib.Cluster(a.cairn, 2, sync_interval_ms=100) as c:
        if not c.peer_dial:
            print("SKIP: no --experimental-peer-dial")
            return SKIP
        n1, n2 = c.nodes
        ok, rep = c.converge(30)
        check(ok, "the fresh pair converges: %s" % rep)
        # settled: both have acknowledged each other's start (publish)
        m1 = wait_for(c, 0, lambda m: lag(m, n2.name) == (0, 0), "n1's lag for n2 is 0")
        m2 = wait_for(c, 1, lambda m: lag(m, n1.name) == (0, 0), "n2's lag for n1 is 0")

        # applied by origin, exactly
        K = 7
        for i in range(K):
            c.put(0, b"m/local-%d" % i, b"v")
        a1 = scrape(c, 0)
        check(applied(a1, "local") == applied(m1, "local") + K,
              "n1 local: %r -> %r after %d puts" % (applied(m1, "local"), applied(a1, "local"), K))
        check(applied(a1, "remote") == applied(m1, "remote"), "n1 remote unchanged by its puts")
        a2 = wait_for(c, 1, lambda m: applied(m, "remote") >= applied(m2, "remote") + K,
                      "n2 remote +%d" % K)
        time.sleep(0.3)  # nothing more may come
        a2 = scrape(c, 1)
        check(applied(a2, "remote") == applied(m2, "remote") + K,
              "n2 remote: %r -> %r" % (applied(m2, "remote"), applied(a2, "remote")))
        check(applied(a2, "local") == applied(m2, "local"), "n2 local unchanged by n1's puts")
        for name, m in (("n1", a1), ("n2", a2)):
            check_batches(m, name)
            check(get(m, "cairn_store_pending_changes") == 0, "%s: nothing pending" % name)

        # lag while n2 is cut off, and after the heal
        wait_for(c, 0, lambda m: lag(m, n2.name) == (0, 0), "n1's lag for n2 is 0 again")
        c.partition([[0], [1]])
        M = 5
        t0 = time.time()
        for i in range(M):
            c.put(0, b"m/cut-%d" % i, b"v")
        p1 = scrape(c, 0)
        ch, sec = lag(p1, n2.name)
        check(ch == M, "cut off: n1's lag for n2 is %d changes: %r" % (M, ch))
        time.sleep(1.0)
        p1b = scrape(c, 0)
        ch2, sec2 = lag(p1b, n2.name)
        age = time.time() - t0
        check(ch2 == M and sec2 is not None and sec2 >= 1.0 and sec2 <= age + 0.5 and
              sec2 > (sec or 0), "cut off: lag seconds grows: %r -> %r (first put %.2f s ago)" %
              (sec, sec2, age))
        check(lag(scrape(c, 1), n1.name) == (0, 0), "cut off: n2 owes n1 nothing")
        print("cut off: n1's lag for n2 %r changes, %r s then %r s" % (ch, sec, sec2))
        c.heal()
        t_heal = time.monotonic()
        wait_for(c, 0, lambda m: lag(m, n2.name) == (0, 0), "healed: n1's lag for n2 back to 0")
        print("healed: lag back to 0 in %.2f s" % (time.monotonic() - t_heal))
        ok, rep = c.converge(BOUND_S)
        check(ok, "healed pair converges: %s" % rep)

        # checkpoint age and changes behind
        k1 = scrape(c, 0)
        age1 = get(k1, "cairn_checkpoint_age_seconds")
        behind1 = get(k1, "cairn_checkpoint_behind_changes")
        check(behind1 >= K + M, "n1 is at least its %d puts behind its checkpoint: %r" %
              (K + M, behind1))
        time.sleep(1.0)
        c.put(0, b"m/one-more", b"v")
        k2 = scrape(c, 0)
        check(get(k2, "cairn_checkpoint_age_seconds") >= age1 + 1.0,
              "checkpoint age grows: %r -> %r" % (age1, get(k2, "cairn_checkpoint_age_seconds")))
        check(get(k2, "cairn_checkpoint_behind_changes") == behind1 + 1,
              "one put, one more behind: %r -> %r" %
              (behind1, get(k2, "cairn_checkpoint_behind_changes")))
        c.restart(0)
        t_restart = time.time()
        k3 = scrape(c, 0)
        age3 = get(k3, "cairn_checkpoint_age_seconds")
        check(age3 < get(k2, "cairn_checkpoint_age_seconds") and
              age3 <= time.time() - t_restart + 5,
              "after a restart the checkpoint is new: age %r" % age3)
        check(get(k3, "cairn_checkpoint_behind_changes") == 0,
              "after a restart nothing is behind: %r" % get(k3, "cairn_checkpoint_behind_changes"))
        for i in range(3):
            c.put(0, b"m/after-%d" % i, b"v")
        k4 = scrape(c, 0)
        check(get(k4, "cairn_checkpoint_behind_changes") == 3,
              "three puts after the restart, three behind: %r" %
              get(k4, "cairn_checkpoint_behind_changes"))
        check(get(k4, "cairn_checkpoint_age_seconds") >= age3, "the age goes on from there")
        # lag is unknown until n2 talks to the restarted n1, then 0 again
        wait_for(c, 0, lambda m: lag(m, n2.name) == (0, 0), "restarted n1's lag for n2 is 0")
        if failures:
            print(clusterlib.logs(c))
    return finish("test_cluster_metrics: all checks passed")


if __name__ == "__main__":
    sys.exit(main())
