#!/usr/bin/env bash
# put-cpu.sh: what one Put costs the server, in a way a noisy machine
# disturbs little. Throughput moves with whatever else runs; the server's
# own CPU time and instruction count per Put move much less, so they are
# the figures to compare two builds by.
#
# For each repetition and each build dir given (alternating: A B A B ...),
# it starts a fresh cairn (<dir>/cairn, pinned to CPU 0), drives closed-loop
# put with cairn-loadgen (pinned to CPU 1) for --duration seconds while
# `perf stat -e instructions,task-clock` counts the server, and prints:
# puts/s, CPU us/Put (utime + stime of every thread, from /proc), task-clock
# us/Put and instructions/Put (perf), then the medians per build.
#
# A build dir may hold cairn.flags (extra server flags, one line) and
# cairn.env (VAR=VALUE words, one line, set for the server only), to
# compare settings of one binary: e.g. a dir with a symlink to another's
# cairn and "--threads 1" in cairn.flags.
#
# How long: about (DURATION + 3 s) per build and repetition (about 40x the
# DURATION under callgrind); it prints the total at the end.
#
# Bounded: each loadgen run stops by itself, each server start waits at
# most 30 s, only PIDs started here are stopped. Data in a temp dir under
# $TMPDIR (default /tmp), removed at exit.
#
# With --callgrind the server runs under valgrind's callgrind instead and
# the figure is user-space instructions per Put (Ir), counted only over
# the measured run (callgrind_control -z after a 3 s warm-up, -d at the
# end). Where perf has no hardware counters (a VM) this is the steady
# figure: it does not move with the load of the machine, though it leaves
# out the kernel's share and the run is about 40x slower. The profile of
# each run is kept, with --out FILE, as FILE.bN.rM.callgrind (for
# callgrind_annotate) and summarised in FILE.bN.rM.txt (inclusive).
#
# With --record DIR it runs `perf record -g` on the server instead of perf
# stat and writes DIR/bN.rM.perf.txt (self time by symbol and library,
# inclusive time by symbol): where the CPU of each run went.
#
# Usage: bench/scripts/put-cpu.sh [--reps N] [--duration S] [--clients N]
#          [--keys N] [--workload W] [--callgrind | --record DIR]
#          [--out FILE] BUILD_DIR [BUILD_DIR ...]
# Needs: cairn-loadgen in the first BUILD_DIR, etcdctl 3.4 (readiness
# probe), perf (linux-perf; instructions need perf_event_paranoid <= 2 for
# user time, root or <= 1 for the kernel's share too).
set -euo pipefail

ORIG=$(pwd)
cd "$(dirname "$0")/../.."
. bench/scripts/lib.sh
REPS=3 DURATION=5 CLIENTS=64 KEYS=10000 WORKLOAD=put OUT="" CALLGRIND=0 RECORD=""
lib_parse put-cpu.sh "reps:REPS duration:DURATION clients:CLIENTS keys:KEYS workload:WORKLOAD out:OUT
  callgrind=CALLGRIND record:RECORD" "$@"
BUILDS=()
for b in "${LIB_ARGS[@]}"; do BUILDS+=("$(cd "$ORIG" && cd "$b" && pwd)"); done
[ ${#BUILDS[@]} -gt 0 ] || { echo "put-cpu: give at least one build dir" >&2; exit 2; }
LOADGEN=${BUILDS[0]}/cairn-loadgen
for b in "${BUILDS[@]}"; do
  [ -x "$b/cairn" ] || { echo "put-cpu: $b/cairn not found" >&2; exit 2; }
done
[ -x "$LOADGEN" ] || { echo "put-cpu: $LOADGEN not found" >&2; exit 2; }
if [ -n "$RECORD" ]; then mkdir -p "$RECORD"; RECORD=$(cd "$RECORD" && pwd); fi
command -v perf >/dev/null || { echo "put-cpu: perf not installed" >&2; exit 2; }

SERVER_PIN=(taskset -c 0)
LOAD_PIN=(taskset -c 1)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/put-cpu.XXXXXX")
trap 'lib_cleanup; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM
CLK_TCK=$(getconf CLK_TCK)
T0=$(date +%s)
sys_ticks() { awk '{ print $15 }' "/proc/$1/stat"; }

echo "put-cpu: $REPS reps x $DURATION s, $WORKLOAD, $CLIENTS clients, $KEYS keys; load average $(cut -d' ' -f1-3 /proc/loadavg)" |
  tee "$WORK/log.txt"
: >"$WORK/rows.tsv"
# The server under callgrind: a wrapper that execs valgrind keeps the PID.
cg_wrapper() { # cg_wrapper BUILD_DIR OUTFILE -> path of the wrapper
  local w=$WORK/cg-wrap-$RANDOM.sh
  printf '#!/bin/sh\nexec valgrind -q --tool=callgrind --callgrind-out-file=%s %s/cairn "$@"\n' "$2" "$1" >"$w"
  chmod +x "$w"
  echo "$w"
}
for rep in $(seq "$REPS"); do
  for i in "${!BUILDS[@]}"; do
    b=${BUILDS[$i]}
    bin=$b/cairn
    cg=$WORK/cg-b$i-r$rep.out
    [ "$CALLGRIND" = 0 ] || bin=$(cg_wrapper "$b" "$cg")
    flags=()
    [ ! -f "$b/cairn.flags" ] || read -r -a flags <"$b/cairn.flags"
    envs=()
    [ ! -f "$b/cairn.env" ] || read -r -a envs <"$b/cairn.env"
    for e in "${envs[@]}"; do export "${e?}"; done
    lib_start_server "b$i-r$rep" "$bin" "${flags[@]}" >/dev/null || { echo "put-cpu: cannot start $bin" >&2; exit 1; }
    for e in "${envs[@]}"; do unset "${e%%=*}"; done
    pid=$SERVER_PID
    pre=()
    [ "$WORKLOAD" = put ] || pre=(--preload)
    run_load() { # run_load SECONDS SEED
      "${LOAD_PIN[@]}" "$LOADGEN" --endpoint "$ENDPOINT" --workload "$WORKLOAD" --clients "$CLIENTS" \
        --keys "$KEYS" --duration "$1" --seed "$2" "${pre[@]}" --format csv --no-header \
        >"$WORK/row.csv" 2>"$WORK/lg.txt" || { echo "put-cpu: loadgen failed:" >&2; cat "$WORK/lg.txt" >&2; exit 1; }
    }
    ins=0 tc=0 cs=0
    if [ "$CALLGRIND" = 1 ]; then
      run_load 3 $((rep + 1000))
      callgrind_control -z "$pid" >/dev/null 2>&1
      c0=$(lib_cpu_ticks "$pid"); s0=$(sys_ticks "$pid")
      run_load "$DURATION" "$rep"
      c1=$(lib_cpu_ticks "$pid"); s1=$(sys_ticks "$pid")
      callgrind_control -d "$pid" >/dev/null 2>&1
      ins=$(awk '/^(summary|totals):/ { print $2; exit }' "$cg.1")
    else
      if [ -n "$RECORD" ]; then
        perf record -g -F 499 -p "$pid" -o "$WORK/perf.data" >/dev/null 2>&1 &
      else
        perf stat -x, -e instructions,task-clock,context-switches -p "$pid" -o "$WORK/perf.txt" &
      fi
      ppid=$!
      c0=$(lib_cpu_ticks "$pid"); s0=$(sys_ticks "$pid")
      run_load "$DURATION" "$rep"
      c1=$(lib_cpu_ticks "$pid"); s1=$(sys_ticks "$pid")
      kill -INT "$ppid"
      wait "$ppid" || true
      if [ -n "$RECORD" ]; then
        lib_perf_report "$WORK/perf.data" "$b/cairn under closed-loop $WORKLOAD, $CLIENTS clients, $DURATION s, rep $rep" \
          "$RECORD/b$i.r$rep.perf.txt" 2
      else
        ins=$(awk -F, '$3 ~ /^instructions/ { print $1 }' "$WORK/perf.txt")
        tc=$(awk -F, '$3 ~ /^task-clock/ { print $1 }' "$WORK/perf.txt")
        cs=$(awk -F, '$3 ~ /^context-switches/ { print $1 }' "$WORK/perf.txt")
      fi
    fi
    lib_cleanup
    IFS=, read -r _ _ _ _ _ _ _ _ _ _ _ _ _ _ ok _ tput _ <"$WORK/row.csv"
    if [ "$CALLGRIND" = 1 ] && [ -n "$OUT" ]; then
      callgrind_annotate --inclusive=yes "$cg.1" 2>/dev/null | head -120 | cut -c1-200 >"$OUT.b$i.r$rep.txt" || true
      cp "$cg.1" "$OUT.b$i.r$rep.callgrind"
    fi
    awk -v b="$i" -v rep="$rep" -v ok="$ok" -v tput="$tput" -v dc=$((c1 - c0)) -v ds=$((s1 - s0)) -v hz="$CLK_TCK" \
      -v ins="${ins:-0}" -v tc="${tc:-0}" -v cs="${cs:-0}" 'BEGIN {
        if (ins !~ /^[0-9]+$/) ins = 0
        if (cs !~ /^[0-9]+$/) cs = 0
        printf "%d\t%d\t%.0f\t%d\t%.2f\t%.2f\t%.0f\t%.2f\t%.3f\n", b, rep, tput, ok, dc * 1e6 / hz / ok, tc * 1e3 / ok, ins / ok, ds * 1e6 / hz / ok, cs / ok }' \
      >>"$WORK/rows.tsv"
    tail -n 1 "$WORK/rows.tsv" | awk -F'\t' -v d="$b" '{
      printf "  rep %d %-40s %8d puts/s %7d ok %7.2f CPU us/put (%5.2f sys) %7.2f task-clock us/put %8d instr/put %6.3f cs/put\n", $2, d, $3, $4, $5, $8, $6, $7, $9 }' |
      tee -a "$WORK/log.txt"
  done
done
{
  echo "medians ($REPS runs; load average now $(cut -d' ' -f1-3 /proc/loadavg)):"
  for i in "${!BUILDS[@]}"; do
    med() { awk -F'\t' -v b="$i" -v c="$1" '$1 == b { print $c }' "$WORK/rows.tsv" | lib_median; }
    printf "  %-40s %8.0f puts/s %7.2f CPU us/put (%5.2f sys) %7.2f task-clock us/put %8.0f instr/put %6.3f cs/put\n" \
      "${BUILDS[$i]}" "$(med 3)" "$(med 5)" "$(med 8)" "$(med 6)" "$(med 7)" "$(med 9)"
  done
} | tee -a "$WORK/log.txt"
echo "put-cpu: took $(($(date +%s) - T0)) s" | tee -a "$WORK/log.txt"
[ -z "$OUT" ] || cp "$WORK/log.txt" "$OUT"
