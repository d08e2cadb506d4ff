#!/usr/bin/env python3
"""What logprobs and embeddings cost through the OpenAI HTTP API.

Starts build/bin/inferd with the default model (2 compute threads, 4 slots) and, over its HTTP unix
socket, alternating in each of --rounds rounds:
  * decode: a non-streamed completion of --gen tokens (ignore_eos, greedy) without logprobs, with
    logprobs (the sampled token's only) and with logprobs=20 (the most alternatives): tokens/s from the
    response's own timing (wall time of the request, minus nothing: the prompt is 5 tokens);
  * embeddings: --inputs short texts (about 12 tokens each) in one request (they share steps, 16 at a
    time) and the same texts one request each: inputs/s.
Prints each round and the medians, with the ratios to the plain decode and to one-at-a-time.

Usage: bench_http_extras.py [--bin-dir build/bin] [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
                            [--rounds 5] [--gen 128] [--inputs 64]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))

import harness  # noqa: E402
from harness import Connection, run_async  # noqa: E402


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=600)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def post(path: str, url: str, body: dict) -> tuple[dict, float]:
    conn = UnixHTTPConnection(path)
    t0 = time.perf_counter()
    conn.request("POST", url, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    out = json.loads(r.read())
    dt = time.perf_counter() - t0
    conn.close()
    assert r.status == 200, out
    return out, dt


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--inputs", type=int, default=64)
    args = ap.parse_args()
    harness.Config.bin_dir = args.bin_dir
    harness.Config.model = args.model
    daemon = harness.Daemon(threads=2).start()
    try:
        async def load():
            conn = await Connection.open(daemon.socket_path)
            await conn.load(harness.Config.model, id="m", contextSize=1024, parallel=4)
            conn.close()

        run_async(load(), daemons=[daemon])
        sock = os.path.join(daemon.dir, "inferd-http.sock")
        texts = [f"Sentence number {i} talks about the weather in town {i % 7}." for i in range(args.inputs)]
        modes = {"plain": None, "logprobs": 0, "logprobs=20": 20}
        rates: dict[str, list[float]] = {k: [] for k in modes}
        batched, single = [], []
        post(sock, "/v1/completions", {"model": "m", "prompt": "Hi", "max_tokens": 8})  # warm up
        for r in range(args.rounds):
            line = []
            for name, lp in modes.items():
                body = {"model": "m", "prompt": "Once upon a time", "max_tokens": args.gen, "temperature": 0,
                        "ignore_eos": True}
                if lp is not None:
                    body["logprobs"] = lp
                out, dt = post(sock, "/v1/completions", body)
                assert out["usage"]["completion_tokens"] == args.gen
                rates[name].append(args.gen / dt)
                line.append(f"{name} {args.gen / dt:.1f} tok/s")
            _, dt = post(sock, "/v1/embeddings", {"model": "m", "input": texts, "encoding_format": "base64"})
            batched.append(args.inputs / dt)
            t0 = time.perf_counter()
            for t in texts:
                post(sock, "/v1/embeddings", {"model": "m", "input": t, "encoding_format": "base64"})
            single.append(args.inputs / (time.perf_counter() - t0))
            line.append(f"embeddings batched {batched[-1]:.1f}/s, one at a time {single[-1]:.1f}/s")
            print(f"round {r + 1}: " + ", ".join(line), flush=True)
    finally:
        daemon.stop()
    med = {k: statistics.median(v) for k, v in rates.items()}
    print("median decode: " + ", ".join(f"{k} {v:.1f} tok/s ({v / med['plain']:.3f}x)" for k, v in med.items()))
    b, s = statistics.median(batched), statistics.median(single)
    print(f"median embeddings of {args.inputs} inputs: one request {b:.1f} inputs/s, one request each {s:.1f} "
          f"inputs/s ({b / s:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
