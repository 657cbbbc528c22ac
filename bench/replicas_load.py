#!/usr/bin/env python3
"""A bounded load on relays, for bench/replicas.sh: creates or execs, spread round robin over
the relays named, CONCURRENCY at a time, N in all; prints one JSON object.

  replicas_load.py creates N CONCURRENCY PROVIDER RELAY_URL[,RELAY_URL...]
      POST /v1/sandboxes (the provider's default sandbox; template `base` for a cloud one) N times; each create is timed to its
      201; the sandboxes are deleted afterwards, untimed.
  replicas_load.py execs N CONCURRENCY ID RELAY_URL[,RELAY_URL...]
      `tether exec ID -- true` N times (TETHER_BIN), each a new client process, as agents'
      harnesses run commands; timed to its exit.

The token is TETHER_TOKEN (any relay's admin token: relays sharing a database share tokens).
Standard library only.
"""

import concurrent.futures
import json
import os
import subprocess
import sys
import time
import urllib.request


def stats(samples, wall):
    s = sorted(samples)
    n = len(s)
    return {
        "count": n,
        "per_second": n / wall,
        "median_ms": s[(n - 1) // 2] * 1e3,
        "p99_ms": s[min(n, max(1, -(-n * 99 // 100))) - 1] * 1e3,
        "wall_s": wall,
    }


def request(method, url, token, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", "Bearer " + token)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=120) as resp:
        text = resp.read()
        return json.loads(text) if text else None


def run(n, concurrency, job):
    samples = []
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        for took in pool.map(job, range(n)):
            samples.append(took)
    return samples, time.monotonic() - start


def creates(n, concurrency, provider, relays, token):
    made = []

    def one(i):
        base = relays[i % len(relays)]
        t = time.monotonic()
        body = {"provider": provider, "ttl": 600}
        if provider != "local":
            body["image"] = "base"  # a cloud provider needs a template; the fake takes any
        info = request("POST", base + "/v1/sandboxes", token, body)
        took = time.monotonic() - t
        made.append((base, info["id"]))
        return took

    samples, wall = run(n, concurrency, one)
    result = stats(samples, wall)
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda m: request("DELETE", m[0] + "/v1/sandboxes/" + m[1], token), made))
    return result


def execs(n, concurrency, sandbox, relays, token):
    tether = os.environ["TETHER_BIN"]

    def one(i):
        env = dict(os.environ, TETHER_RELAY=relays[i % len(relays)], TETHER_TOKEN=token)
        t = time.monotonic()
        subprocess.run([tether, "exec", sandbox, "--", "true"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        return time.monotonic() - t

    samples, wall = run(n, concurrency, one)
    return stats(samples, wall)


def main(argv):
    if len(argv) != 6 or argv[1] not in ("creates", "execs"):
        sys.exit(__doc__)
    what, n, concurrency, target, relays = argv[1], int(argv[2]), int(argv[3]), argv[4], argv[5]
    relays = [r.rstrip("/") for r in relays.split(",")]
    token = os.environ["TETHER_TOKEN"]
    job = creates if what == "creates" else execs
    print(json.dumps(job(n, concurrency, target, relays, token)))


if __name__ == "__main__":
    main(sys.argv)
