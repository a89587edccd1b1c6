#!/usr/bin/python3
"""report.py: the results table of scripts/bench.sh.

Reads DIR/raw.tsv (figure, system, repetition, value per line) and
DIR/env.txt, takes the median of every figure per system and the cairn/etcd
ratio, checks the targets, and writes DIR/results.md (a headline table, then
every figure by part), DIR/summary.csv and DIR/ycsb.dat (the
throughput-latency curve, for the plots). With --latest FILE it also puts
the headline table at the top of FILE (bench/results/LATEST.md) and this
run's link first in FILE's list of runs. Standard library only.

Usage: report.py --dir DIR --rates "500 1000 ..." --big-keys N
                 [--latest FILE --commit C]
"""

import argparse
import math
import os
from collections import defaultdict

TABLE_BEGIN = "<!-- table: scripts/bench.sh rewrites it after a full run -->"
TABLE_END = "<!-- end of table -->"
RUNS_MARK = "<!-- runs, newest first: scripts/bench.sh adds full runs here -->"


def median(v):
    v = sorted(x for x in v if not math.isnan(x))
    if not v:
        return math.nan
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def fmt(x):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if abs(x) >= 100:
        return "{:,.0f}".format(x)
    if abs(x) >= 10:
        return "%.1f" % x
    return "%.2f" % x


def check(ratio, target):
    """'met' or 'MISSED' for a target like '>= 2' or '<= 0.5'."""
    if not target or math.isnan(ratio):
        return ""
    op, lim = target.split()
    ok = ratio >= float(lim) if op == ">=" else ratio <= float(lim)
    return "met" if ok else "MISSED"


class Run:
    def __init__(self, d):
        self.vals = defaultdict(list)
        with open(os.path.join(d, "raw.tsv")) as f:
            for line in f:
                p = line.rstrip("\n").split("\t")
                if len(p) != 4:
                    continue
                try:
                    self.vals[(p[0], p[1])].append(float(p[3]))
                except ValueError:
                    pass

    def med(self, fig, s):
        return median(self.vals.get((fig, s), []))

    def n(self, fig, a="etcd", b="cairn"):
        return min(len(self.vals.get((fig, a), [])), len(self.vals.get((fig, b), [])))

    def has(self, fig):
        return any(k[0] == fig for k in self.vals)


def ycsb_curve(run, rates):
    """The open-loop sweep: (curve rows, etcd's saturation rate or None, whether etcd ever failed)."""
    etcd_sat, etcd_failed, curve = None, False, []
    for r in rates:
        f = "ycsb-a-%d" % r
        if not run.has(f + ".tput"):
            continue
        held = {}
        for s in ("etcd", "cairn"):
            t, u = run.med(f + ".tput", s), run.med(f + ".unsent", s)
            held[s] = (not math.isnan(t)) and t >= 0.95 * r and u == 0
            curve.append((s, r, t, run.med(f + ".p50", s), run.med(f + ".p99", s), held[s]))
        # etcd's saturation rate: the last rate it held before the first it
        # did not (noise can make a higher rate pass again; that one does not
        # count).
        if held["etcd"] and not etcd_failed:
            etcd_sat = r
        elif not held["etcd"]:
            etcd_failed = True
    return curve, etcd_sat, etcd_failed


PEAK = [("put", "put, 64 clients", ">= 2"),
        ("range", "range 1 key, linearizable, 32 clients", None),
        ("range-ser", "range 1 key, serializable, 32 clients", ">= 3"),
        ("range-prefix-ser", "range 100-key prefix, serializable, 32 clients", None),
        ("txn-cas", "txn CAS (read + Txn), 64 clients", None)]
MIXED = [("mixed-a", "YCSB A (50% read / 50% update), 64 clients"),
         ("mixed-b", "YCSB B (95% read / 5% update), 64 clients")]
EB = [("eb-put", "put --key-size=18 --val-size=32", ">= 2"),
      ("eb-range-s", "range 1 key --consistency=s", ">= 3"),
      ("eb-range-l", "range 1 key --consistency=l", None)]


def headline(run, rates, big_keys):
    """The one table: (figure, unit, etcd, cairn, ratio, target, met) rows."""
    rows = []

    def add(label, fig, unit, target=None):
        e, c = run.med(fig, "etcd"), run.med(fig, "cairn")
        if math.isnan(e) and math.isnan(c):
            return
        ratio = c / e if e and not math.isnan(e) and not math.isnan(c) else math.nan
        rows.append((label, unit, fmt(e), fmt(c), fmt(ratio) + "×", target or "", check(ratio, target)))

    for key, label, tgt in PEAK:
        add("peak %s" % label, key + ".tput", "ops/s", tgt)
    for key, label in MIXED:
        add("mixed %s" % label, key + ".tput", "ops/s")
    curve, sat, failed = ycsb_curve(run, rates)
    if sat and failed:
        add("YCSB A open loop p99 at etcd's saturation (%s ops/s)" % "{:,}".format(sat),
            "ycsb-a-%d.p99" % sat, "ms", "<= 0.5")
    elif curve:
        rows.append(("YCSB A open loop p99 at etcd's saturation", "ms", "–", "–",
                     "etcd held %s" % ("every rate" if sat else "no rate"), "<= 0.5", "not measured"))
    add("watch put → event p50", "watch.p50", "ms")
    add("watch put → event p99", "watch.p99", "ms")
    for key, label, tgt in EB:
        add("etcd benchmark %s, 100 clients" % label, key + ".tput", "req/s", tgt)
    k = "{:,}".format(big_keys)
    add("%s keys: load time" % k, "load.seconds", "s")
    add("%s keys: RSS after the load" % k, "big.rss_mib", "MiB", "<= 0.5")
    add("%s keys: disk after the load" % k, "big.disk_mib", "MiB", "<= 0.5")
    add("%s keys: restart, exec → first answered Range" % k, "restart.seconds", "s", "<= 0.25")
    s, b = run.med("batch.tput", "single"), run.med("batch.tput", "batched")
    if not (math.isnan(s) or math.isnan(b)):
        cost = 1 - s / b
        rows.append(("one change per Put: cost against batching (1 − single/batched)", "put ops/s", "–", "%s single, %s batched" % (fmt(s), fmt(b)), "%.1f%%" % (100 * cost),
                     "<= 10%", "met" if cost <= 0.10 else "MISSED"))
    return rows


def headline_md(rows):
    out = ["| figure | etcd | cairn | cairn/etcd | target |", "|---|---:|---:|---:|---|"]
    for label, unit, e, c, ratio, target, met in rows:
        tcol = ""
        if target:
            op, lim = target.split()
            tcol = "%s %s%s %s" % ({">=": "≥", "<=": "≤"}[op], lim, "" if lim.endswith("%") else "×", met)
        out.append("| %s, %s | %s | %s | %s | %s |" % (label, unit, e, c, ratio, tcol))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--rates", required=True)
    ap.add_argument("--big-keys", type=int, required=True)
    ap.add_argument("--latest")
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args()
    run = Run(a.dir)
    rates = [int(r) for r in a.rates.split()]
    top = headline_md(headline(run, rates, a.big_keys))
    if a.latest:
        write_latest(a.latest, a.dir, a.commit, top)
        return

    rows = []  # (section, figure label, unit, etcd, cairn, target, figure key)

    def add(section, label, fig, unit, target=None):
        rows.append((section, label, unit, run.med(fig, "etcd"), run.med(fig, "cairn"), target, fig))

    for key, label, tgt in PEAK:
        add("Peak closed loop (cairn-loadgen, 10,000 keys)", label + ": ops/s", key + ".tput", "ops/s", tgt)
        add("Peak closed loop (cairn-loadgen, 10,000 keys)", label + ": p50", key + ".p50", "ms")
        add("Peak closed loop (cairn-loadgen, 10,000 keys)", label + ": p99", key + ".p99", "ms")
    for key, label in MIXED:
        sec = "Mixed closed loop (cairn-loadgen, 10,000 keys)"
        add(sec, label + ": ops/s", key + ".tput", "ops/s")
        for what, name in (("p50", "p50"), ("p99", "p99"), ("read_p50", "read p50"),
                           ("read_p99", "read p99"), ("write_p50", "update p50"), ("write_p99", "update p99")):
            add(sec, "%s: %s" % (label, name), "%s.%s" % (key, what), "ms")

    curve, etcd_sat, etcd_failed = ycsb_curve(run, rates)
    for s_, r, t, p50, p99, held in curve:
        if s_ != "etcd":
            continue
        f = "ycsb-a-%d" % r
        hc = [h for (s2, r2, _, _, _, h) in curve if r2 == r and s2 == "cairn"]
        sec = "YCSB A open loop (50% read / 50% update, 10,000 keys)"
        add(sec, "YCSB A at %d ops/s: achieved ops/s (held: etcd %s, cairn %s)" %
            (r, "yes" if held else "no", "yes" if hc and hc[0] else "no"), f + ".tput", "ops/s")
        add(sec, "YCSB A at %d ops/s: p50" % r, f + ".p50", "ms")
        add(sec, "YCSB A at %d ops/s: p99" % r, f + ".p99", "ms")

    add("Watch", "put -> event latency p50", "watch.p50", "ms")
    add("Watch", "put -> event latency p99", "watch.p99", "ms")

    for key, label, tgt in EB:
        sec = "etcd's benchmark (--conns=10 --clients=100, servers not pinned)"
        add(sec, label + ": requests/s", key + ".tput", "req/s", tgt)
        add(sec, label + ": mean", key + ".mean", "ms")
        add(sec, label + ": p50", key + ".p50", "ms")
        add(sec, label + ": p99", key + ".p99", "ms")
        add(sec, label + ": seconds a run", key + ".seconds", "s")

    sec = "Client TLS (https://, --client-cert-auth, the same certificates)"
    for key, label in (("tls-put", "put, 64 clients"), ("tls-range-ser", "range serializable, 32 clients")):
        add(sec, label + ": ops/s", key + ".tput", "ops/s")
        add(sec, label + ": p50", key + ".p50", "ms")
        add(sec, label + ": p99", key + ".p99", "ms")
    add(sec, "new TLS connections per second (openssl s_time -new)", "tls-handshake.per_s", "conn/s")

    sec = "%s keys (18-byte keys, 32-byte values)" % "{:,}".format(a.big_keys)
    add(sec, "load time", "load.seconds", "s")
    add(sec, "load throughput", "load.tput", "ops/s")
    add(sec, "resident memory (VmRSS) after the load", "big.rss_mib", "MiB", "<= 0.5")
    add(sec, "on-disk bytes (du of the data dir)", "big.disk_mib", "MiB", "<= 0.5")
    add(sec, "restart: exec to first answered Range", "restart.seconds", "s", "<= 0.25")
    add(sec, "resident memory after the restarts", "big.rss_restart_mib", "MiB")
    add(sec, "on-disk bytes after the restarts (cairn: with its checkpoint)", "big.disk_restart_mib", "MiB")
    add(sec, "keys counted after the restarts", "big.keys_after_restart", "keys")

    env_path = os.path.join(a.dir, "env.txt")
    env = open(env_path).read() if os.path.exists(env_path) else ""
    out = ["# cairn beside etcd: benchmark results\n", "```\n" + env.strip() + "\n```\n",
           "Every figure is the median over the repetitions (n below) of runs made "
           "alternately against etcd and cairn on the same machine in the same script; "
           "ratio = cairn / etcd. Latencies are in ms. Load, RSS and on-disk bytes are one "
           "measurement each (n = 1).\n", "## Headline\n", top + "\n"]
    summary = ["section,figure,unit,etcd,cairn,ratio,target,met,n"]
    cur = None
    for section, label, unit, e, c, target, fig in rows:
        if math.isnan(e) and math.isnan(c):
            continue
        if section != cur:
            out.append("\n### %s\n\n| figure | unit | etcd | cairn | cairn/etcd | n | target |\n"
                       "|---|---|---:|---:|---:|---:|---|" % section)
            cur = section
        ratio = c / e if e and not math.isnan(e) and not math.isnan(c) else math.nan
        met = check(ratio, target)
        out.append("| %s | %s | %s | %s | %s | %d | %s |" % (label, unit, fmt(e), fmt(c), fmt(ratio) + "x",
                                                         run.n(fig), ("%s %s" % (target, met)) if target else ""))
        summary.append('%s,"%s",%s,%s,%s,%s,%s,%s,%d' % (section.split(" (")[0], label, unit, e, c, ratio,
                                                        target or "", met, run.n(fig)))
    if etcd_sat and etcd_failed:
        f = "ycsb-a-%d.p99" % etcd_sat
        e, c = run.med(f, "etcd"), run.med(f, "cairn")
        ratio = c / e if e else math.nan
        summary.append('Targets,"YCSB A p99 at etcd saturation rate %d",ms,%s,%s,%s,<= 0.5,%s,%d' %
                       (etcd_sat, e, c, ratio, check(ratio, "<= 0.5"), run.n(f)))

    if run.has("batch.tput"):
        out.append("\n### One change per Put (cairn against cairn --experimental-batch-writes 64)\n\n"
                   "| figure | unit | single | batched | single/batched | n |\n|---|---|---:|---:|---:|---:|")
        for fig, label, unit in (("batch.tput", "put, 64 clients: ops/s", "ops/s"),
                                 ("batch.p50", "put p50", "ms"), ("batch.p99", "put p99", "ms"),
                                 ("batch.puts_per_change", "Puts per change", "puts"),
                                 ("batch.cpu_us", "server CPU per Put", "µs")):
            s, b = run.med(fig, "single"), run.med(fig, "batched")
            out.append("| %s | %s | %s | %s | %s | %d |" % (label, unit, fmt(s), fmt(b),
                                                        fmt(s / b if b else math.nan) + "x",
                                                        run.n(fig, "single", "batched")))
        s, b = run.med("batch.tput", "single"), run.med("batch.tput", "batched")
        if b:
            out.append("\nCost of one change per Put: %.1f%% of peak put throughput (1 − single/batched "
                       "medians; target ≤ 10%%).\n" % (100 * (1 - s / b)))
            summary.append('Batch,"one change per Put: cost",ratio,%s,%s,%s,<= 0.1,%s,%d' %
                           (b, s, 1 - s / b, "met" if 1 - s / b <= 0.1 else "MISSED",
                            run.n("batch.tput", "single", "batched")))

    cluster_md = os.path.join(a.dir, "cluster.md")
    if os.path.exists(cluster_md):   # the cluster part's own table (cluster_bench.py)
        out.append("\n" + open(cluster_md).read().replace("## cluster", "### Cluster", 1))

    out.append("\nYCSB A: a rate is *held* when the median achieved throughput is at least 95% of "
               "the target and no request slot went unsent (requests that took longer than the "
               "loadgen's 5 s deadline count as failed, so a queue that never drains does not hold); "
               "open-loop latency is measured from each request's scheduled time (no coordinated "
               "omission). etcd's benchmark gives requests/s over its whole run of a fixed --total; "
               "its raw output is in `etcd-bench/`.\n")
    out.append("Plots (when gnuplot was installed): `ycsb-a.png` (throughput–latency), "
               "`cdf-*.png` (latency CDFs, repetition 1).\n")
    with open(os.path.join(a.dir, "results.md"), "w") as f:
        f.write("\n".join(out) + "\n")
    with open(os.path.join(a.dir, "summary.csv"), "w") as f:
        f.write("\n".join(summary) + "\n")
    if curve:
        with open(os.path.join(a.dir, "ycsb.dat"), "w") as f:
            f.write("# system target_rate achieved_ops_s p50_ms p99_ms held\n")
            for s in ("etcd", "cairn"):
                for sys_, r, t, p50, p99, held in curve:
                    if sys_ == s and not math.isnan(t):
                        f.write("%s %d %.1f %.3f %.3f %d\n" % (s, r, t, p50, p99, held))
                f.write("\n\n")
        with open(os.path.join(a.dir, "etcd-saturation-rate.txt"), "w") as f:
            f.write("%s\n" % (etcd_sat or ""))


def write_latest(path, run_dir, commit, table):
    """Replace the table of LATEST.md and add this run first in its list."""
    name = os.path.basename(os.path.normpath(run_dir))
    text = open(path).read() if os.path.exists(path) else "# Latest benchmark results\n\n%s\n%s\n\n%s\n" % (
        TABLE_BEGIN, TABLE_END, RUNS_MARK)
    head, rest = text.split(TABLE_BEGIN, 1)
    _, tail = rest.split(TABLE_END, 1)
    intro = ("Newest full run: [%s/results.md](%s/results.md), commit %s. Medians of alternating runs "
             "on one machine; ratio = cairn/etcd.\n\n" % (name, name, commit))
    tail = tail.replace(RUNS_MARK, "%s\n\n- Full run, commit %s: [%s/results.md](%s/results.md)" %
                        (RUNS_MARK, commit, name, name), 1)
    with open(path, "w") as f:
        f.write(head + TABLE_BEGIN + "\n" + intro + table + "\n" + TABLE_END + tail)


if __name__ == "__main__":
    main()
