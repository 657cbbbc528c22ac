#!/usr/bin/env bash
# Tether next to OpenSSH on loopback, in one run: starts a private sshd (host and client keys
# in a temporary directory, one reused connection through ControlMaster) and a private Tether
# relay with one local sandbox, measures the same things through both with bench/measure.py,
# runs `tether bench --embedded --direct` (its own relay and sandbox, same binaries, and the
# data path again straight to the agent), and prints the figures side by side: every table of
# the README's Performance section comes from one run.
#
#   bench/compare.sh            # full: 1 GiB transfers
#   bench/compare.sh --quick    # small sizes, a smoke check
#   KEEP=DIR bench/compare.sh   # also keeps the raw results (results.jsonl, bench.json) in DIR
#
# Needs root on a fresh Debian machine (it installs openssh-server, and local sandboxes need
# namespaces). TETHER_BIN and TETHER_AGENT_BIN choose prebuilt binaries; otherwise they are
# built (release), with the static musl agent when its target is installed. Files go through
# /dev/shm here and /tmp in the sandbox (its own disk: ext4 on a loop device, in the host's
# page cache; sshd's "remote" is this machine, so its side uses /dev/shm too). Each download
# reads a file the sandbox has read once before, so it comes from the page cache.
set -euo pipefail

repo="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
measure="$repo/bench/measure.py"

runs=3; latency_runs=100; keys=1000; bytes=$((1 << 30))
if [ "${1:-}" = "--quick" ]; then
    runs=1; latency_runs=10; keys=100; bytes=$((32 << 20))
fi
block=65536
count=$((bytes / block))

step() { printf '== %s\n' "$*" >&2; }

# --- what is needed -------------------------------------------------------------------
if [ ! -x /usr/sbin/sshd ] || ! command -v ssh >/dev/null || ! command -v scp >/dev/null; then
    step "installing openssh-server"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq openssh-server openssh-client >/dev/null
fi
command -v python3 >/dev/null || { echo "compare.sh needs python3" >&2; exit 1; }

if [ -z "${TETHER_BIN:-}" ]; then
    step "building tether (release)"
    cargo build --release -q --manifest-path "$repo/Cargo.toml" -p tether-agent
    cargo build --release -q --manifest-path "$repo/Cargo.toml" -p tether-cli
    TETHER_BIN="$repo/target/release/tether"
    if [ -z "${TETHER_AGENT_BIN:-}" ] && rustup target list --installed 2>/dev/null \
        | grep -qx x86_64-unknown-linux-musl; then
        cargo build --release -q --manifest-path "$repo/Cargo.toml" \
            --target x86_64-unknown-linux-musl -p tether-agent
        TETHER_AGENT_BIN="$repo/target/x86_64-unknown-linux-musl/release/tether-agent"
    fi
fi
export TETHER_AGENT_BIN="${TETHER_AGENT_BIN:-$(dirname "$TETHER_BIN")/tether-agent}"
tether() { "$TETHER_BIN" "$@"; }

# --- a private sshd and a private relay, cleaned up on exit ----------------------------
work=$(mktemp -d /tmp/tether-compare.XXXXXX)
sshd_pid=""; relay_pid=""; sandbox=""; made_user=""
cleanup() {
    set +e
    [ -n "$sandbox" ] && tether rm "$sandbox" >/dev/null 2>&1
    [ -n "$relay_pid" ] && kill "$relay_pid" 2>/dev/null && wait "$relay_pid" 2>/dev/null
    ssh -F "$work/ssh_config" -O exit bench >/dev/null 2>&1
    [ -n "$sshd_pid" ] && kill "$sshd_pid" 2>/dev/null && wait "$sshd_pid" 2>/dev/null
    [ -n "$made_user" ] && userdel "$made_user" >/dev/null 2>&1
    rm -rf "$work" /dev/shm/tether-compare-*
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

step "starting sshd on loopback"
# ssh runs commands through the login shell, and bash sources ~/.bashrc for sshd: a heavy
# rc file (pyenv, nvm) would be measured as ssh's cost. As root, log in as a throwaway user
# whose shell is /bin/sh and whose home is empty.
ssh_user=$(id -un)
if [ "$(id -u)" = 0 ]; then
    ssh_user=tether-compare
    mkdir -p "$work/home"
    if ! id "$ssh_user" >/dev/null 2>&1; then
        useradd --system --password '*' --shell /bin/sh --home-dir "$work/home" --no-create-home "$ssh_user"
        made_user=$ssh_user
    else
        # Left by an interrupted run: its home is gone, and sshd would warn on every login.
        usermod --home "$work/home" --shell /bin/sh "$ssh_user"
    fi
fi
chmod 755 "$work"
ssh-keygen -q -t ed25519 -N '' -f "$work/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$work/id"
cp "$work/id.pub" "$work/authorized_keys"
chmod 644 "$work/authorized_keys"
port=$(free_port)
mkdir -p /run/sshd
cat > "$work/sshd_config" <<EOF
ListenAddress 127.0.0.1
Port $port
HostKey $work/host_key
AuthorizedKeysFile $work/authorized_keys
PidFile $work/sshd.pid
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
PrintMotd no
StrictModes no
UsePAM no
LogLevel ERROR
Subsystem sftp internal-sftp
EOF
/usr/sbin/sshd -f "$work/sshd_config" -D -e 2>"$work/sshd.log" &
sshd_pid=$!
cat > "$work/ssh_config" <<EOF
Host bench
    HostName 127.0.0.1
    Port $port
    User $ssh_user
    IdentityFile $work/id
    IdentitiesOnly yes
    UserKnownHostsFile /dev/null
    StrictHostKeyChecking no
    LogLevel ERROR
    ControlMaster auto
    ControlPath $work/cm-%C
    ControlPersist 10m
EOF
for _ in $(seq 100); do
    ssh -F "$work/ssh_config" -o BatchMode=yes bench true 2>/dev/null && break
    sleep 0.05
done
ssh -F "$work/ssh_config" -O check bench 2>/dev/null || { cat "$work/sshd.log" >&2; exit 1; }

step "starting a relay and a sandbox"
"$TETHER_BIN" serve --listen 127.0.0.1:0 --data-dir "$work/relay" >"$work/relay.out" 2>"$work/relay.log" &
relay_pid=$!
for _ in $(seq 200); do grep -q '^listening ' "$work/relay.out" 2>/dev/null && break; sleep 0.05; done
export TETHER_RELAY=$(sed -n 's/^listening //p' "$work/relay.out")
[ -n "$TETHER_RELAY" ] || { cat "$work/relay.log" >&2; exit 1; }
export TETHER_TOKEN=$(cat "$work/relay/admin.token")
sandbox=$(tether create --memory 3G)  # room to keep the 1 GiB file in its page cache

# --- measurements: one JSON line per result --------------------------------------------
results="$work/results.jsonl"
# A measurement that fails is reported and shows as n/a in the table; the run goes on.
record() {
    local key=$1; shift
    local out
    if out=$(python3 "$measure" "$@"); then
        printf '%s\n' "$out" | sed "s/^{/{\"key\": \"$key\", /" >> "$results"
    else
        echo "$key: not measured" >&2
    fi
}
src=/dev/shm/tether-compare-src
dst=/dev/shm/tether-compare-dst
head -c "$bytes" /dev/urandom > "$src"
sshc=(ssh -F "$work/ssh_config" bench)
scpc=(scp -q -F "$work/ssh_config")
rm_remote="$TETHER_BIN exec $sandbox -- rm -f /tmp/tb.bin"

step "exec true"
record ssh_true run "$latency_runs" -- "${sshc[@]}" true
record exec_cli run "$latency_runs" -- "$TETHER_BIN" exec "$sandbox" -- true

step "keystroke echo"
record ssh_keys keys "$keys" -- ssh -tt -F "$work/ssh_config" bench cat
record keys_cli keys "$keys" -- "$TETHER_BIN" exec -t -i "$sandbox" -- cat

step "stdout, piped"
dd_cmd="dd if=/dev/zero bs=$block count=$count status=none"
record ssh_stdout rate "$runs" "$bytes" -- "${sshc[@]}" "$dd_cmd"
record stdout_cli rate "$runs" "$bytes" -- "$TETHER_BIN" exec "$sandbox" -- sh -c "$dd_cmd"

step "upload"
record ssh_up_cat rate "$runs" "$bytes" --setup "rm -f $dst" -- \
    sh -c "${sshc[*]} 'cat > $dst' < $src"
record scp_up rate "$runs" "$bytes" --setup "rm -f $dst" -- "${scpc[@]}" "$src" "bench:$dst"
record up_cat rate "$runs" "$bytes" --setup "$rm_remote" -- \
    sh -c "$TETHER_BIN exec -i $sandbox -- sh -c 'cat > /tmp/tb.bin' < $src"
record up_cp rate "$runs" "$bytes" --setup "$rm_remote" -- \
    "$TETHER_BIN" cp "$src" "$sandbox:/tmp/tb.bin"

step "download"
# The last upload's file, written back and read once: downloads come from the page cache.
tether exec "$sandbox" -- sh -c 'sync && cat /tmp/tb.bin > /dev/null'
record ssh_down_cat rate "$runs" "$bytes" -- sh -c "${sshc[*]} cat $src > $dst"
record scp_down rate "$runs" "$bytes" -- "${scpc[@]}" "bench:$src" "$dst"
record down_cat rate "$runs" "$bytes" -- sh -c "$TETHER_BIN exec $sandbox -- cat /tmp/tb.bin > $dst"
record down_cp rate "$runs" "$bytes" --setup "rm -f $dst" -- "$TETHER_BIN" cp "$sandbox:/tmp/tb.bin" "$dst"
tether exec "$sandbox" -- rm -f /tmp/tb.bin
rm -f "$src" "$dst"

step "SWE-ReX (optional: pip install swe-rex into a private venv)"
if python3 -m venv "$work/swerex" >/dev/null 2>&1 \
    && "$work/swerex/bin/pip" install -q swe-rex aiohttp >/dev/null 2>&1; then
    swerex_port=$(free_port)
    "$work/swerex/bin/swerex-remote" --port "$swerex_port" --auth-token bench >/dev/null 2>&1 &
    swerex_pid=$!
    "$work/swerex/bin/python" "$measure" swerex "$latency_runs" "$swerex_port" bench \
        | sed 's/^{/{"key": "swerex_exec", /' >> "$results" || echo "SWE-ReX: not measured" >&2
    kill "$swerex_pid" 2>/dev/null; wait "$swerex_pid" 2>/dev/null || true
else
    echo "SWE-ReX: not measured (python3 -m venv or pip install swe-rex failed)" >&2
fi

step "tether bench --embedded --direct (its own relay and sandbox)"
# The compared sandbox goes first: the bench's idle sessions need the descriptors.
tether rm "$sandbox" >/dev/null && sandbox=""
quick=(); [ "${1:-}" = "--quick" ] && quick=(--quick)
tether bench "${quick[@]}" --embedded --direct --json > "$work/bench.json" || true
if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP" && cp "$results" "$work/bench.json" "$KEEP/"
fi

echo
echo "tether $(tether --version | awk '{print $2}') vs $(ssh -V 2>&1 | cut -d, -f1), $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs"
python3 "$measure" table "$results" "$work/bench.json"
