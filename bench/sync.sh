#!/usr/bin/env bash
# Benchmarks `tether sync` side by side with rsync over ssh, on this machine, in one run:
#
#  1. change-to-remote latency: a local file is rewritten while `tether sync --watch` runs,
#     and the time until the new content is readable in the sandbox's workspace (polled on
#     the host, where the local provider keeps it) is measured; median and p99.
#  2. initial sync of a 10,000-file, 200 MB tree into an empty directory: `tether sync`
#     (one-shot, no compression: the relay is on loopback; and again with gzip) against
#     `rsync -a` over ssh to 127.0.0.1; median of several runs each, in alternating order.
#
# Prints a Markdown table (tether, rsync, ratio) ready for the README. The machine this
# runs on may be shared: run it a few times and quote medians.
#
# Needs: python3, rsync, openssh-server and openssh-client (apt-get install -y rsync
# openssh-server openssh-client). Runs as root (sshd with key-based root login on a
# loopback port, started and stopped here). Set TETHER_BIN and TETHER_AGENT_BIN to use
# prebuilt binaries; otherwise a release build is made.
#
# Usage: bench/sync.sh [--quick]   (--quick: fewer samples and runs)
set -euo pipefail
cd "$(dirname "$0")/.."

samples=200 runs=5
if [[ "${1:-}" == "--quick" ]]; then samples=50 runs=1; fi

if [[ -z "${TETHER_BIN:-}" || -z "${TETHER_AGENT_BIN:-}" ]]; then
    cargo build --release -q -p tether-agent
    cargo build --release -q -p tether-cli
    TETHER_BIN=$PWD/target/release/tether
    TETHER_AGENT_BIN=$PWD/target/release/tether-agent
fi
export TETHER_AGENT_BIN
for tool in python3 rsync ssh ssh-keygen /usr/sbin/sshd; do
    command -v "$tool" >/dev/null || { echo "bench/sync.sh needs $tool (apt-get install -y rsync openssh-server openssh-client python3)" >&2; exit 1; }
done

work=$(mktemp -d /var/tmp/tether-bench.XXXXXX)
pids=()
cleanup() {
    # The sandbox first, while the relay that can delete it still runs.
    [[ -n "${sandbox:-}" ]] && "$TETHER_BIN" rm "$sandbox" >/dev/null 2>&1 || true
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# --- a relay and a sandbox -------------------------------------------------------------
relay_port=$(free_port)
export TETHER_HOME=$work/home TETHER_RELAY=http://127.0.0.1:$relay_port
"$TETHER_BIN" serve --listen "127.0.0.1:$relay_port" --data-dir "$work/relay" >"$work/relay.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [[ -s $work/relay/admin.token ]] && TETHER_TOKEN=$(cat "$work/relay/admin.token") "$TETHER_BIN" ls -q >/dev/null 2>&1 && break; sleep 0.05; done
export TETHER_TOKEN=$(cat "$work/relay/admin.token")
sandbox=$("$TETHER_BIN" create)
workspace=$work/relay/local/$sandbox/workspace
[[ -d $workspace ]] || { echo "cannot find the sandbox's workspace at $workspace" >&2; exit 1; }

# --- 1. latency --------------------------------------------------------------------------
lat=$work/lat
python3 - "$lat" <<'PY'
import os, sys
root = sys.argv[1]
for d in range(20):
    os.makedirs(f"{root}/src/m{d}", exist_ok=True)
    for f in range(50):
        with open(f"{root}/src/m{d}/f{f}.txt", "w") as fh:
            fh.write(f"module {d} file {f}\n" * 40)
PY
"$TETHER_BIN" sync --watch --json "$lat" "$sandbox:/workspace/lat" >"$work/watch.log" 2>&1 &
pids+=($!)
for _ in $(seq 600); do grep -q '"watching"' "$work/watch.log" && break; sleep 0.05; done
grep -q '"watching"' "$work/watch.log" || { echo "tether sync --watch did not start:" >&2; cat "$work/watch.log" >&2; exit 1; }

latency=$(python3 - "$lat" "$workspace/lat" "$samples" <<'PY'
import os, random, statistics, sys, time
local, remote, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
random.seed(7)
samples = []
for i in range(n):
    name = f"src/m{i % 20}/f{i % 50}.txt"
    body = f"edit {i} {random.random()}\n" * random.randint(1, 60)
    with open(os.path.join(local, name), "w") as fh:
        start = time.perf_counter()
        fh.write(body)
    target = os.path.join(remote, name)
    deadline = start + 10
    while True:
        try:
            with open(target) as fh:
                if fh.read() == body:
                    break
        except OSError:
            pass
        if time.perf_counter() > deadline:
            sys.exit(f"edit {i} not visible within 10 s")
        time.sleep(0.0002)
    samples.append((time.perf_counter() - start) * 1000)
    time.sleep(random.uniform(0.03, 0.08))
samples.sort()
p99 = samples[min(len(samples) - 1, int(round(0.99 * len(samples))) - 1)]
print(f"{statistics.median(samples):.1f} {p99:.1f} {samples[0]:.1f} {samples[-1]:.1f} {len(samples)}")
PY
)
read -r lat_median lat_p99 lat_min lat_max lat_n <<<"$latency"

# --- 2. initial sync against rsync over ssh -----------------------------------------------
tree=$work/tree
python3 - "$tree" <<'PY'
import os, random, sys
root = sys.argv[1]
rng = random.Random(42)
# 10,000 files, 200 MB: 9,900 source-like files of 1-19 KiB (half text, half random
# bytes) in 1,000 directories, and 100 files of about 1 MiB (assets, build inputs).
words = [b"fn", b"let", b"match", b"impl", b"struct", b"return", b"self", b"async", b"await", b"=>"]
for i in range(10_000):
    d = f"{root}/pkg{i % 100:02d}/sub{(i // 100) % 10}"
    os.makedirs(d, exist_ok=True)
    if i % 100 == 99:
        size = 1_048_576 + rng.randint(-4096, 4096)
    else:
        size = rng.randint(1024, 19_456)
    if i % 2:
        body = rng.randbytes(size)
    else:
        line = b" ".join(rng.choice(words) for _ in range(12)) + b"\n"
        body = (line * (size // len(line) + 1))[:size]
    with open(f"{d}/file{i:05d}.dat", "wb") as fh:
        fh.write(body)
PY
tree_bytes=$(find "$tree" -type f -printf '%s\n' | awk '{ n += $1 } END { print n }')
tree_files=$(find "$tree" -type f | wc -l)

ssh_dir=$work/ssh
mkdir -p "$ssh_dir" /run/sshd
ssh-keygen -q -t ed25519 -N '' -f "$ssh_dir/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$ssh_dir/client_key"
cp "$ssh_dir/client_key.pub" "$ssh_dir/authorized_keys"
ssh_port=$(free_port)
cat >"$ssh_dir/sshd_config" <<CFG
Port $ssh_port
ListenAddress 127.0.0.1
HostKey $ssh_dir/host_key
PidFile $ssh_dir/sshd.pid
AuthorizedKeysFile $ssh_dir/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
CFG
/usr/sbin/sshd -D -f "$ssh_dir/sshd_config" -E "$ssh_dir/sshd.log" &
pids+=($!)
ssh_cmd="ssh -p $ssh_port -i $ssh_dir/client_key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
for _ in $(seq 100); do $ssh_cmd root@127.0.0.1 true 2>/dev/null && break; sleep 0.05; done

now() { python3 -c 'import time; print(time.perf_counter())'; }
elapsed() { python3 -c "print(f'{($2 - $1) * 1000:.0f}')"; }
median() { python3 -c 'import statistics, sys; print(f"{statistics.median(float(x) for x in sys.argv[1:]):.0f}")' "$@"; }
seconds() { python3 -c "print(f'{$1 / 1000:.2f} s')"; }

# Warm the page cache for both the same way: read the tree once.
cat $(find "$tree" -type f) >/dev/null

# Every run lands in a new directory and nothing is deleted until the end: ext4 allocates
# inodes slowly right after many deletions (it skips recently freed ones), which would
# penalise whichever tool ran first after a cleanup. The order alternates for the same reason.
run_tether() { # run, compression
    t0=$(now); "$TETHER_BIN" sync --compress "$2" --json "$tree" "$sandbox:/workspace/tree-$2-$1" >"$work/sync-$2-$1.log"; t1=$(now)
    elapsed "$t0" "$t1"
}
run_rsync() { # run
    t0=$(now); rsync -a -e "$ssh_cmd" "$tree/" "root@127.0.0.1:$work/rsync-$1/"; t1=$(now)
    elapsed "$t0" "$t1"
}
tether_ms=() tether_gz_ms=() rsync_ms=()
for run in $(seq "$runs"); do
    if (( run % 2 )); then
        tether_ms+=("$(run_tether "$run" never)"); rsync_ms+=("$(run_rsync "$run")")
    else
        rsync_ms+=("$(run_rsync "$run")"); tether_ms+=("$(run_tether "$run" never)")
    fi
    tether_gz_ms+=("$(run_tether "$run" always)")
    # Every copy must be whole.
    for copy in "$workspace/tree-never-$run" "$workspace/tree-always-$run" "$work/rsync-$run"; do
        [[ $(find "$copy" -type f | wc -l) == "$tree_files" ]] || { echo "the copy in $copy is incomplete" >&2; exit 1; }
    done
done
t_med=$(median "${tether_ms[@]}") gz_med=$(median "${tether_gz_ms[@]}") r_med=$(median "${rsync_ms[@]}")
ratio() { python3 -c "print(f'{$1 / $2:.1f}x')"; }

mb=$((tree_bytes / 1000000))
row() { printf '| %-58s | %-9s | %-17s | %-14s |\n' "$@"; }
echo "tether sync benchmark: $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
echo "median of $runs runs each, alternating order; change latency over $lat_n edits"
echo
row "measure" "tether" "rsync -a over ssh" "rsync / tether"
row "$(printf '%.0s-' {1..58})" "---------" "-----------------" "--------------"
row "initial sync, $tree_files files / $mb MB, loopback" "$(seconds "$t_med")" "$(seconds "$r_med")" "$(ratio "$r_med" "$t_med")"
row "initial sync, same tree, gzip (--compress always)" "$(seconds "$gz_med")" "$(seconds "$r_med")" "$(ratio "$r_med" "$gz_med")"
row "change to remote visibility, median (--watch)" "${lat_median} ms" "-" "-"
row "change to remote visibility, p99 (--watch)" "${lat_p99} ms" "-" "-"
echo
echo "runs (ms): tether ${tether_ms[*]} | tether gzip ${tether_gz_ms[*]} | rsync ${rsync_ms[*]}"
echo "latency min/max: ${lat_min} / ${lat_max} ms; goals: latency median < 100 ms, initial sync >= 2x rsync"
