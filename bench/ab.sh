#!/usr/bin/env bash
# Two builds of Tether back to back on this machine, in alternating rounds, each round with a
# fresh private relay (running that build's agent) and one local sandbox:
#
#   A_BIN=... A_AGENT=... B_BIN=... B_AGENT=... bench/ab.sh throughput   # MB/s
#   A_BIN=... A_AGENT=... B_BIN=... B_AGENT=... bench/ab.sh latency      # ms
#
# throughput: `tether exec ID -- dd` of MIB MiB to /dev/null, `tether cp` of a MIB MiB file up
# and down (/dev/shm here, the sandbox's /tmp there: its own disk, so the file is read once
# before the timed download, which then comes from the page cache, as an upload goes to it). latency: `tether exec ID -- true` as a new process N times, and
# `tether create` + `tether exec` of the new sandbox M times (create to first output through
# the CLI), each measured by bench/measure.py (median, p99). ROUNDS (default 5) rounds; the
# summary prints each build's per-round medians and their median. Needs root (local sandboxes).
set -euo pipefail
repo="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
measure="$repo/bench/measure.py"
mode=${1:?usage: bench/ab.sh throughput|latency}
rounds=${ROUNDS:-5}; mib=${MIB:-1024}; n=${N:-150}; m=${M:-15}
declare -A BIN=([a]=${A_BIN:?set A_BIN} [b]=${B_BIN:?set B_BIN})
declare -A AGENT=([a]=${A_AGENT:?set A_AGENT} [b]=${B_AGENT:?set B_AGENT})
work=$(mktemp -d /tmp/tether-ab.XXXXXX)
src=/dev/shm/tether-ab-src; dst=/dev/shm/tether-ab-dst
relay=""
cleanup() {
    set +e
    [ -n "$relay" ] && kill "$relay" 2>/dev/null && wait "$relay" 2>/dev/null
    rm -rf "$work" "$src" "$dst"
}
trap cleanup EXIT
results="$work/results.jsonl"
mbps() { python3 -c "import sys; print(round($mib * 1048576 / ($2 - $1) / 1e6))"; }
now() { date +%s.%N; }
put() { printf '{"build": "%s", "key": "%s", "value": %s}\n' "$1" "$2" "$3" >> "$results"; }
[ "$mode" = throughput ] && head -c $((mib << 20)) /dev/urandom > "$src"
for round in $(seq "$rounds"); do
    for build in a b; do
        b=${BIN[$build]}
        dir="$work/$round-$build"
        TETHER_AGENT_BIN=${AGENT[$build]} "$b" serve --listen 127.0.0.1:0 --data-dir "$dir" \
            >"$dir.out" 2>"$dir.log" &
        relay=$!
        for _ in $(seq 200); do grep -q '^listening ' "$dir.out" 2>/dev/null && break; sleep 0.05; done
        export TETHER_RELAY=$(sed -n 's/^listening //p' "$dir.out")
        [ -n "$TETHER_RELAY" ] || { cat "$dir.log" >&2; exit 1; }
        export TETHER_TOKEN=$(cat "$dir/admin.token")
        sb=$("$b" create --memory 3G)
        if [ "$mode" = throughput ]; then
            "$b" exec "$sb" -- dd if=/dev/zero bs=1M count=64 >/dev/null 2>&1
            t0=$(now); "$b" exec "$sb" -- dd if=/dev/zero bs=1M count="$mib" 2>/dev/null >/dev/null; t1=$(now)
            put "$build" "stdout MB/s" "$(mbps "$t0" "$t1")"
            t0=$(now); "$b" cp "$src" "$sb:/tmp/ab.bin"; t1=$(now)
            put "$build" "cp upload MB/s" "$(mbps "$t0" "$t1")"
            "$b" exec "$sb" -- sh -c 'sync && cat /tmp/ab.bin > /dev/null'
            rm -f "$dst"; t0=$(now); "$b" cp "$sb:/tmp/ab.bin" "$dst"; t1=$(now)
            put "$build" "cp download MB/s" "$(mbps "$t0" "$t1")"
        else
            ms=$(python3 "$measure" run "$n" -- "$b" exec "$sb" -- true \
                | python3 -c 'import json,sys; print(json.load(sys.stdin)["median_us"] / 1000)')
            put "$build" "exec new process ms" "$ms"
            others="for s in \$($b ls -q); do [ \$s = $sb ] || $b rm \$s >/dev/null; done"
            ms=$(python3 "$measure" run "$m" --setup "$others" -- \
                sh -c "s=\$($b create) && $b exec \$s -- echo hi >/dev/null" \
                | python3 -c 'import json,sys; print(json.load(sys.stdin)["median_us"] / 1000)')
            put "$build" "create to first output ms" "$ms"
        fi
        for s in $("$b" ls -q); do "$b" rm "$s" >/dev/null; done
        kill "$relay"; wait "$relay" 2>/dev/null || true; relay=""
    done
done
python3 - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
for key in dict.fromkeys(r["key"] for r in rows):
    for build in ("a", "b"):
        vals = [r["value"] for r in rows if r["key"] == key and r["build"] == build]
        print(f"{key:28} {build}: median {statistics.median(vals):g}  rounds {vals}")
PY
