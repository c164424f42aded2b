#!/usr/bin/env bash
# A repeatable instruction count of the broker's user-space work:
# runs `runnel serve --fsync never` under callgrind, drives a fixed load
# (100 pipelined batches of 256 PRODUCEs of 128 B, then 100 FETCH+ACK rounds
# of 256) with drive.py, stops the broker with SIGINT and prints the top
# functions. Given the echo floor (target/release/runnel-floor) instead, it
# counts the floor's instructions for the same load: what runnel spends
# above that is its own. RUNNEL_MODE=--memory-only counts runnel without a
# log instead. DRIVE=drive_dedup.py drives produces with dedup ids instead
# (DEDUP=0: the same without). Usage: bench/profile/callgrind.sh [path/to/runnel]
set -euo pipefail
# CALLGRIND_PORT moves the broker off 17731 (two counts at once on one machine).
port=${CALLGRIND_PORT:-17731}
export CALLGRIND_PORT=$port
here=$(cd "$(dirname "$0")" && pwd)
runnel=${1:-$here/../../target/release/runnel}
out=$(mktemp -d)
case "$(basename "$runnel")" in
  runnel-floor*) args=(--listen 127.0.0.1:$port) ;;
  *) case "${RUNNEL_MODE:-}" in
       --memory-only) args=(serve --listen 127.0.0.1:$port --memory-only) ;;
       *) args=(serve --listen 127.0.0.1:$port --data "$out/data" --fsync never) ;;
     esac ;;
esac
valgrind --tool=callgrind --callgrind-out-file="$out/cg.out" \
  "$runnel" "${args[@]}" >"$out/vg.log" 2>&1 &
pid=$!
for _ in $(seq 100); do python3 -c "import socket; socket.create_connection(('127.0.0.1',$port))" 2>/dev/null && break; sleep 0.1; done
python3 "$here/${DRIVE:-drive.py}"
kill -INT "$pid"; wait "$pid" || true
cp "$out/cg.out" /tmp/last-cg.out 2>/dev/null || true
callgrind_annotate "$out/cg.out" 2>/dev/null | sed -n '/PROGRAM TOTALS/p;/file:function/,+20p'
