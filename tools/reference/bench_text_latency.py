#!/usr/bin/env python3
"""How long `status` waits while another client tokenizes the largest text the daemon allows.

Starts build/bin/inferd with the default model, then for --rounds rounds: client A tokenizes a text of
max-text-bytes (4 MiB, the default limit) while client B calls status back to back; reports, over all
rounds, the tokenization's duration and status's latency (median and max) during it, next to status's
latency on an idle daemon. Client A runs in its own process, so that decoding its answer (a million ids,
in Python) cannot delay B's timing. Tokenization runs on the daemon's text thread, so status should not wait for it.

Usage: bench_text_latency.py [--bin-dir build/bin] [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--rounds 5]
Needs: pycapnp (the e2e tests' client).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))

import harness  # noqa: E402
from harness import Connection, run_async  # noqa: E402


def capnp_run(coro):
    import capnp  # noqa: PLC0415 - only where a client runs
    return capnp.run(coro)

LIMIT = 4 << 20
WORDS = "the quick brown fox jumps over the lazy dog "


async def tokenize_rounds(socket_path: str, rounds: int) -> list:
    """The other client (its own process: decoding a million ids in Python must not delay our timing)."""
    a = await Connection.open(socket_path)
    text = (WORDS * (LIMIT // len(WORDS) + 1))[:LIMIT]
    durations = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await a.tokenize("m", text)
        durations.append(time.perf_counter() - t0)
    a.close()
    return durations


async def measure(socket_path: str, rounds: int) -> dict:
    b = await Connection.open(socket_path)
    await b.load(harness.Config.model, id="m", contextSize=256, parallel=1)
    idle = []
    for _ in range(50):
        t0 = time.perf_counter()
        await b.status()
        idle.append(time.perf_counter() - t0)
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--tokenize-child", socket_path,
                              "--rounds", str(rounds)], stdout=subprocess.PIPE, text=True)
    busy = []
    while child.poll() is None:
        s0 = time.perf_counter()
        await b.status()
        busy.append(time.perf_counter() - s0)
    out = child.stdout.read().split()
    b.close()
    return {"idle": idle, "busy": busy, "tokenize": [float(v) for v in out]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokenize-child", metavar="SOCKET", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tokenize_child:
        durations = asyncio.run(capnp_run(tokenize_rounds(args.tokenize_child, args.rounds)))
        print(" ".join(f"{d:.6f}" for d in durations))
        return 0
    harness.Config.bin_dir = args.bin_dir
    harness.Config.model = args.model
    daemon = harness.Daemon(threads=1).start()
    try:
        r = run_async(measure(daemon.socket_path, args.rounds), daemons=[daemon])
    finally:
        daemon.stop()
    ms = lambda v: v * 1000.0  # noqa: E731
    print(f"tokenize of {LIMIT} bytes: median {statistics.median(r['tokenize']):.3f} s over {args.rounds} rounds")
    print(f"status on an idle daemon: median {ms(statistics.median(r['idle'])):.2f} ms, "
          f"max {ms(max(r['idle'])):.2f} ms ({len(r['idle'])} calls)")
    print(f"status while tokenizing:  median {ms(statistics.median(r['busy'])):.2f} ms, "
          f"max {ms(max(r['busy'])):.2f} ms ({len(r['busy'])} calls)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
