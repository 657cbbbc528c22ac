#!/usr/bin/env bash
# Benchmarks the egress proxy of allowlisted local sandboxes, on this machine, in one run:
#
#  1. added latency per HTTPS request: a fresh connection and TLS handshake per request
#     (Python's http.client in the sandbox), median and p99, from an allowlisted sandbox
#     (through the relay's proxy) and from a sandbox on the host's network (direct);
#  2. throughput of a 100 MB download over HTTPS (curl), both ways.
#
# The upstream is a Python HTTPS server in a network namespace made here (a veth pair to the
# host, a private /30), named in the relay's --egress-hosts. Prints a Markdown table for the
# README. The machine may be shared: run it a few times and quote medians.
#
# Needs root, python3, curl, iproute2 and nftables. Set TETHER_BIN and TETHER_AGENT_BIN to use
# prebuilt binaries; otherwise a release build is made.
#
# Usage: bench/egress.sh [--quick]   (--quick: fewer requests)
set -euo pipefail
cd "$(dirname "$0")/.."

requests=300
if [[ "${1:-}" == "--quick" ]]; then requests=60; fi

if [[ -z "${TETHER_BIN:-}" || -z "${TETHER_AGENT_BIN:-}" ]]; then
    cargo build --release -q -p tether-agent
    cargo build --release -q -p tether-cli
    TETHER_BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/tether
    TETHER_AGENT_BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/tether-agent
fi
export TETHER_AGENT_BIN
for tool in python3 curl ip nft openssl; do
    command -v "$tool" >/dev/null || { echo "bench/egress.sh needs $tool (apt-get install -y python3 curl iproute2 nftables openssl)" >&2; exit 1; }
done

work=$(mktemp -d /var/tmp/tether-egress-bench.XXXXXX)
ns=tether-egbench$$
relay_pid="" server_pid=""
cleanup() {
    if [[ -n "$relay_pid" ]]; then
        "$TETHER_BIN" rm --all >/dev/null 2>&1 || true
        kill "$relay_pid" 2>/dev/null || true
        wait "$relay_pid" 2>/dev/null || true
    fi
    [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# The upstream: 10.250.0.2 in its own namespace, HTTPS on 443 for bench.egress.test.
ip netns add "$ns"
ip link add egb$$h type veth peer name egb$$u
ip link set egb$$u netns "$ns"
ip addr add 10.250.0.1/30 dev egb$$h
ip link set egb$$h up
ip -n "$ns" addr add 10.250.0.2/30 dev egb$$u
ip -n "$ns" link set egb$$u up
ip -n "$ns" link set lo up
mkdir -p "$work/www"
head -c 100000000 /dev/zero > "$work/www/100mb"
echo ok > "$work/www/small"
# A CA of the bench's own and a certificate for the upstream signed by it: the sandboxes that
# reach the upstream directly or through the proxy trust the CA; the relay trusts it for the
# intercepted one (--egress-ca-file).
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=egress bench CA" \
    -keyout "$work/ca.key" -out "$work/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=bench.egress.test \
    -keyout "$work/key.pem" -out "$work/cert.csr" 2>/dev/null
printf 'subjectAltName=DNS:bench.egress.test\n' > "$work/san.ext"
openssl x509 -req -in "$work/cert.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" \
    -CAcreateserial -days 1 -extfile "$work/san.ext" -out "$work/cert.pem" 2>/dev/null
ip netns exec "$ns" python3 - "$work" <<'PY' > "$work/server.out" &
import http.server, ssl, sys, functools
work = sys.argv[1]
class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
handler = functools.partial(Quiet, directory=f"{work}/www")
server = http.server.ThreadingHTTPServer(("0.0.0.0", 443), handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(f"{work}/cert.pem", f"{work}/key.pem")
server.socket = ctx.wrap_socket(server.socket, server_side=True)
print("ready", flush=True)
server.serve_forever()
PY
server_pid=$!
for _ in $(seq 100); do grep -q ready "$work/server.out" 2>/dev/null && break; sleep 0.1; done

echo "10.250.0.2 bench.egress.test" > "$work/hosts"
"$TETHER_BIN" serve --listen 127.0.0.1:0 --data-dir "$work/relay" --egress-hosts "$work/hosts" \
    --egress-ca-file "$work/ca.pem" \
    > "$work/relay.out" 2> "$work/relay.err" &
relay_pid=$!
for _ in $(seq 100); do grep -q '^listening ' "$work/relay.out" 2>/dev/null && break; sleep 0.1; done
export TETHER_RELAY=$(sed -n 's/^listening //p' "$work/relay.out")
export TETHER_TOKEN=$(cat "$work/relay/admin.token")

proxied=$("$TETHER_BIN" create --allow-host bench.egress.test)
direct=$("$TETHER_BIN" create --network host)
# A secret bound to the upstream: its HTTPS is intercepted, and the placeholder in each
# request's Authorization header replaced.
intercepted=$(BENCH_TOKEN=bench-token-value "$TETHER_BIN" create \
    --secret BENCH_TOKEN@bench.egress.test)
cacert=$(cat "$work/ca.pem")

# latency SANDBOX HOST_OR_ADDR [secret]: prints "median p99" in ms of $requests fresh HTTPS
# requests; with "secret", trusting the sandbox's own bundle (SSL_CERT_FILE, set by the relay)
# and sending the placeholder in an Authorization header.
latency() {
    "$TETHER_BIN" exec "$1" -- python3 -c "
import http.client, os, ssl, socket, time, statistics
secret = '${3:-}' == 'secret'
ctx = ssl.create_default_context() if secret else ssl.create_default_context(cadata='''$cacert''')
headers = {'Host': 'bench.egress.test'}
if secret:
    headers['Authorization'] = 'Bearer ' + os.environ['BENCH_TOKEN']
addr = socket.gethostbyname('$2')
times = []
for _ in range($requests):
    t = time.perf_counter()
    c = http.client.HTTPSConnection(addr, 443, context=ctx)
    c.sock = ctx.wrap_socket(socket.create_connection((addr, 443)), server_hostname='bench.egress.test')
    c.request('GET', '/small', headers=headers)
    c.getresponse().read()
    c.close()
    times.append((time.perf_counter() - t) * 1000)
times.sort()
print(f'{statistics.median(times):.2f} {times[int(len(times) * 0.99) - 1]:.2f}')
"
}
# download SANDBOX CURL_ARGS: prints MB/s of the 100 MB file.
download() {
    "$TETHER_BIN" exec "$1" -- sh -c "printf '%s' '$cacert' > /tmp/bench-ca.pem && \
        curl -sS $2 -o /dev/null -w '%{speed_download}' \
        https://bench.egress.test/100mb" | awk '{printf "%.0f", $1 / 1000000}'
}

read -r p_med p_p99 < <(latency "$proxied" bench.egress.test)
read -r d_med d_p99 < <(latency "$direct" 10.250.0.2)
read -r i_med i_p99 < <(latency "$intercepted" bench.egress.test secret)
p_tp=$(download "$proxied" "--cacert /tmp/bench-ca.pem")
d_tp=$(download "$direct" "--cacert /tmp/bench-ca.pem --resolve bench.egress.test:443:10.250.0.2")
i_tp=$(download "$intercepted" "-H \"Authorization: Bearer \$BENCH_TOKEN\"")

added() { awk "BEGIN{printf \"%+.2f\", $1 - $2}"; }
echo "| HTTPS, fresh connection per request ($requests) | direct | through the proxy | added | secret injected | added |"
echo "|---|---|---|---|---|---|"
echo "| median | ${d_med} ms | ${p_med} ms | $(added "$p_med" "$d_med") ms | ${i_med} ms | $(added "$i_med" "$d_med") ms |"
echo "| p99 | ${d_p99} ms | ${p_p99} ms | $(added "$p_p99" "$d_p99") ms | ${i_p99} ms | $(added "$i_p99" "$d_p99") ms |"
echo "| 100 MB download | ${d_tp} MB/s | ${p_tp} MB/s | | ${i_tp} MB/s | |"
