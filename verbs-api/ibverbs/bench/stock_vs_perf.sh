#!/bin/bash
# Stock perftest over softnic's libibverbs.so.1 against `softnic perf` in the same run.
#
# Starts two NICs on loopback (127.77.0.1 and .2, UDP 4791), then alternates, ROUNDS
# times, the stock binary and `softnic perf` with the same parameters:
#   ib_write_bw -s 65536 -n ITERS    vs  softnic perf write_bw -s 65536 -n ITERS
#   ib_send_lat -s 8    -n LATITERS  vs  softnic perf send_lat -s 8 -n LATITERS
# and prints every result, the medians and the ratios (write_bw: stock / perf average
# MB/s; send_lat: perf / stock typical latency, so > 1 means stock is faster; the
# issue's target is >= 0.95 for both). Nothing here is a pass/fail test: the numbers
# depend on the machine and on its load, which this script prints.
#
# Usage: verbs-api/ibverbs/bench/stock_vs_perf.sh [ROUNDS] (default 5)
#   SOFTNIC=path/to/softnic   default target/release/softnic (build it first:
#                             cargo build --release -p softnic)
#   ITERS / LATITERS          default 10000 / 5000
#   STOCK_ENV="K=V …"         extra environment for the stock binaries only
set -euo pipefail
ROUNDS=${1:-5}
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
SOFTNIC=${SOFTNIC:-$ROOT/target/release/softnic}
ITERS=${ITERS:-10000}
LATITERS=${LATITERS:-5000}
[ -x "$SOFTNIC" ] || { echo "no $SOFTNIC: cargo build --release -p softnic" >&2; exit 1; }
for b in ib_write_bw ib_send_lat; do
    command -v $b >/dev/null || { echo "$b missing: apt-get install perftest" >&2; exit 1; }
done
WORK=$(mktemp -d)
export SOFTNIC_DIR=$WORK
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
"$SOFTNIC" run --name svp-a --addr 127.77.0.1 >"$WORK/a.log" 2>&1 &
PIDS+=($!)
"$SOFTNIC" run --name svp-b --addr 127.77.0.2 >"$WORK/b.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do
    [ -S "$WORK/svp-a.sock" ] && [ -S "$WORK/svp-b.sock" ] && break
    sleep 0.1
done
PORT=$((20000 + $$ % 20000))

# pair SERVER-CMD CLIENT-CMD COLUMN: runs both, prints the client's result column
# (4 = BW average for bw tests, 5 = t_typical for latency tests).
pair() {
    PORT=$((PORT + 1))
    timeout 120 bash -c "$1 -p $PORT" >"$WORK/srv" 2>&1 &
    local s=$!
    sleep 0.3
    timeout 120 bash -c "$2 -p $PORT 127.77.0.1" >"$WORK/cli" 2>&1 || true
    wait $s || true
    awk -v c="$3" 'f && NF >= c { print $c; exit } /#bytes/ { f = 1 }' "$WORK/cli"
}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

STOCK="env ${STOCK_ENV:-} $SOFTNIC exec"
BW_ARGS="-x 1 -F -s 65536 -n $ITERS"
LAT_ARGS="-x 1 -F -s 8 -n $LATITERS"
: >"$WORK/r"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)   cpus: $(nproc)"
for i in $(seq "$ROUNDS"); do
    sb=$(pair "$STOCK -d svp-a -- ib_write_bw $BW_ARGS" "$STOCK -d svp-b -- ib_write_bw $BW_ARGS" 4)
    pb=$(pair "$SOFTNIC perf -d svp-a $BW_ARGS write_bw" "$SOFTNIC perf -d svp-b $BW_ARGS write_bw" 4)
    sl=$(pair "$STOCK -d svp-a -- ib_send_lat $LAT_ARGS" "$STOCK -d svp-b -- ib_send_lat $LAT_ARGS" 5)
    pl=$(pair "$SOFTNIC perf -d svp-a $LAT_ARGS send_lat" "$SOFTNIC perf -d svp-b $LAT_ARGS send_lat" 5)
    echo "round $i: write_bw MB/s stock ${sb:-fail} perf ${pb:-fail} | send_lat t_typical us stock ${sl:-fail} perf ${pl:-fail}"
    echo "$sb $pb $sl $pl" >>"$WORK/r"
done
echo "load after:  $(cut -d' ' -f1-3 /proc/loadavg)"
col() { awk -v c="$1" '$c != "" { print $c }' "$WORK/r" | median; }
SB=$(col 1) PB=$(col 2) SL=$(col 3) PL=$(col 4)
echo "median write_bw -s 65536: stock $SB MB/s, softnic perf $PB MB/s, ratio stock/perf $(awk -v a="$SB" -v b="$PB" 'BEGIN { printf "%.2f", a / b }')"
echo "median send_lat -s 8:     stock $SL us, softnic perf $PL us, ratio perf/stock $(awk -v a="$PL" -v b="$SL" 'BEGIN { printf "%.2f", a / b }')"
