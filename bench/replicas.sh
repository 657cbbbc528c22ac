#!/usr/bin/env bash
# Benchmarks relays as replicas on this machine, in one run:
#
#  1. creates per second, and execs per second (`tether exec ID -- true`, a new client process
#     each), through one relay on SQLite, one relay on PostgreSQL, and three relays sharing
#     PostgreSQL (requests spread round robin), with local sandboxes and with a fake cloud
#     provider (tether-fake e2b, whose sandboxes are real local ones behind E2B's API);
#  2. the relay-to-relay hop: `tether exec ID -- true` and a 256 MiB `tether cp` download of a
#     local sandbox through its own relay and through another one.
#
# Everything runs here, on loopback: a private PostgreSQL server (Debian's binaries, its own
# port and data directory), the fake, the relays. Every load is bounded. Prints a Markdown
# table; the raw figures stay in the work directory it names. The machine may be shared: run
# it a few times and quote medians.
#
# Needs root (local sandboxes), python3 and postgresql. Set TETHER_BIN, TETHER_AGENT_BIN and
# TETHER_FAKE_BIN to use prebuilt binaries; otherwise `cli`-profile builds are made.
#
# Usage: bench/replicas.sh [--quick]   (--quick: a tenth of the load)
set -euo pipefail
cd "$(dirname "$0")/.."

creates=40 execs=300 concurrency=8 hops=100 cp_mib=256
if [[ "${1:-}" == "--quick" ]]; then creates=8 execs=30 hops=10 cp_mib=16; fi

target=${CARGO_TARGET_DIR:-$PWD/target}
if [[ -z "${TETHER_BIN:-}" || -z "${TETHER_AGENT_BIN:-}" || -z "${TETHER_FAKE_BIN:-}" ]]; then
    cargo build --profile cli -q -p tether-agent
    cargo build --profile cli -q -p tether-cli -p tether-fakes
    TETHER_BIN=$target/cli/tether TETHER_AGENT_BIN=$target/cli/tether-agent
    TETHER_FAKE_BIN=$target/cli/tether-fake
fi
export TETHER_BIN TETHER_AGENT_BIN
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[[ -x "$pgbin/initdb" ]] || { echo "bench/replicas.sh needs PostgreSQL: apt-get install postgresql" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bench/replicas.sh needs python3" >&2; exit 1; }

work=$(mktemp -d /var/tmp/tether-replicas-bench.XXXXXX)
chown postgres "$work"
pids=()
cleanup() {
    # Every relay first removes what is left of the load (a failed run leaves sandboxes).
    for out in "$work"/*.out; do
        local name dir url
        name=$(basename "$out" .out) dir=$work/$(basename "$out" .out)
        url=$(grep -m1 -o 'http://[0-9.:]*' "$out" 2>/dev/null) || continue
        [[ -f "$dir/admin.token" ]] || continue
        TETHER_RELAY=$url TETHER_TOKEN=$(cat "$dir/admin.token") "$TETHER_BIN" rm --all \
            >/dev/null 2>&1 || true
    done
    for pid in "${pids[@]}" $(cat "$work"/*.pid 2>/dev/null); do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    echo "raw figures: $work/*.json" >&2
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# PostgreSQL, private: no fsync, as the tests run it; it is the relays that are measured.
pgport=$(free_port)
setpriv --reuid=postgres --regid=postgres --clear-groups "$pgbin/initdb" -D "$work/pg" -U tether \
    --auth=trust -E UTF8 --no-sync >/dev/null
setpriv --reuid=postgres --regid=postgres --clear-groups "$pgbin/postgres" -D "$work/pg" \
    -p "$pgport" -k "$work" -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off \
    -c max_connections=300 >"$work/pg.log" 2>&1 &
pids+=($!)
until "$pgbin/pg_isready" -q -h 127.0.0.1 -p "$pgport"; do sleep 0.1; done
database() { "$pgbin/createdb" -h 127.0.0.1 -p "$pgport" -U tether "$1"; echo "postgres://tether@127.0.0.1:$pgport/$1"; }

# Waits for `listening URL` in file $1; prints the URL.
listening() {
    for _ in $(seq 300); do
        if url=$(grep -m1 -o 'listening .*' "$1" 2>/dev/null); then echo "${url#listening }"; return; fi
        sleep 0.1
    done
    echo "nothing listened (see $1 and ${1%.out}.log)" >&2; exit 1
}

"$TETHER_FAKE_BIN" e2b --listen 127.0.0.1:0 --data-dir "$work/fake" --agent-bin "$TETHER_AGENT_BIN" \
    >"$work/fake.out" 2>"$work/fake.log" &
pids+=($!)
fake=$(listening "$work/fake.out")
export E2B_API_KEY=e2b_fake_key E2B_API_URL=$fake E2B_SANDBOX_URL=$fake TETHER_LOG=warn

# Room for every sandbox a load keeps at once (the built-in policy allows 32 per tenant).
printf '[defaults]\nmax_sandboxes = 1000\n' >"$work/policy.toml"

# start_relay NAME [serve args...]: prints its URL.
start_relay() {
    local name=$1; shift
    "$TETHER_BIN" serve --listen 127.0.0.1:0 --data-dir "$work/$name" --config "$work/policy.toml" "$@" \
        >"$work/$name.out" 2>"$work/$name.log" &
    # Called in $(...): the pid goes to a file, which the cleanup reads.
    echo $! >"$work/$name.pid"
    listening "$work/$name.out"
}

load() { python3 bench/replicas_load.py "$@"; }
field() { python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))[sys.argv[2]], ${3:-1}))" "$work/$4.json" "$1"; }

# measure CONFIG RELAYS: creates and execs, local and e2b, through the comma-separated RELAYS.
measure() {
    local config=$1 relays=$2 first=${2%%,*}
    export TETHER_TOKEN=$(cat "$work/$config-1/admin.token")
    for provider in local e2b; do
        echo "$config: $creates creates ($provider), $concurrency at a time" >&2
        load creates "$creates" "$concurrency" "$provider" "$relays" >"$work/$config-creates-$provider.json"
        image=()
        [[ $provider == local ]] || image=(--image base)
        id=$(TETHER_RELAY=$first "$TETHER_BIN" create --provider "$provider" "${image[@]}" --ttl 30m)
        echo "$config: $execs execs ($provider), $concurrency at a time" >&2
        load execs "$execs" "$concurrency" "$id" "$relays" >"$work/$config-execs-$provider.json"
        TETHER_RELAY=$first "$TETHER_BIN" rm "$id" >/dev/null
    done
}

one_sqlite=$(start_relay one-sqlite-1)
measure one-sqlite "$one_sqlite"
key="$work/relay.key"
python3 -c 'import secrets; print(secrets.token_hex(32))' >"$key"
url=$(database one)
one_pg=$(start_relay one-pg-1 --database "$url" --key-file "$key")
measure one-pg "$one_pg"
url=$(database three)
three=()
for n in 1 2 3; do three+=("$(start_relay "three-pg-$n" --database "$url" --key-file "$key")"); done
measure three-pg "$(IFS=,; echo "${three[*]}")"

# The hop: a local sandbox of relay 1, through relay 1 and through relay 2.
export TETHER_TOKEN=$(cat "$work/three-pg-1/admin.token")
id=$(TETHER_RELAY=${three[0]} "$TETHER_BIN" create --ttl 30m)
TETHER_RELAY=${three[0]} "$TETHER_BIN" exec "$id" -- sh -c "head -c ${cp_mib}M /dev/zero > /tmp/blob"
for via in 0 1; do
    name=$([[ $via == 0 ]] && echo owner || echo hop)
    echo "hop: $hops execs and 5 downloads of $cp_mib MiB through the $name" >&2
    TETHER_RELAY=${three[$via]} python3 bench/measure.py run "$hops" -- "$TETHER_BIN" exec "$id" -- true \
        >"$work/hop-exec-$name.json"
    TETHER_RELAY=${three[$via]} python3 bench/measure.py rate 5 $((cp_mib << 20)) \
        --setup "rm -f $work/blob" -- "$TETHER_BIN" cp "$id:/tmp/blob" "$work/blob" >"$work/hop-cp-$name.json"
done
rm -f "$work/blob"
TETHER_RELAY=${three[0]} "$TETHER_BIN" rm "$id" >/dev/null

echo
echo "| | 1 relay, SQLite | 1 relay, PostgreSQL | 3 relays, PostgreSQL |"
echo "| --- | --- | --- | --- |"
for what in creates execs; do
    for provider in local e2b; do
        row="| $what/s, $provider (median / p99 latency) |"
        for config in one-sqlite one-pg three-pg; do
            f=$config-$what-$provider
            row+=" $(field per_second x 1 "$f") ($(field median_ms x 1 "$f") / $(field p99_ms x 1 "$f") ms) |"
        done
        echo "$row"
    done
done
echo
echo "| hop | through the owner | through another relay |"
echo "| --- | --- | --- |"
us() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"{d['median_us']/1e3:.1f} ms (p99 {d['p99_us']/1e3:.1f})\")" "$work/$1.json"; }
mbs() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"{d['median_bytes_per_s']/1e6:.0f} MB/s\")" "$work/$1.json"; }
echo "| \`tether exec ID -- true\` | $(us hop-exec-owner) | $(us hop-exec-hop) |"
echo "| \`tether cp\` download, $cp_mib MiB | $(mbs hop-cp-owner) | $(mbs hop-cp-hop) |"
