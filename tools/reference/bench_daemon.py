#!/usr/bin/env python3
"""IPC overhead and serving throughput of inferd, measured side by side in one run.

1. Decode tokens/s of the in-process engine (build/tools/inferd-bench) and of the same model through the
   daemon, alternately for --rounds rounds, same threads, same prompt and generation lengths, with three
   clients: `inferctl generate` (C++, libinferd-client), a pycapnp client, and OpenAI's HTTP API streamed
   as server-sent events over the daemon's HTTP unix socket (http.client). The Cap'n Proto rates come
   from the daemon's own first-to-last-token time, the HTTP rate from the client's arrival times of the
   first and last text events; the clients differ in the CPU they take from the two compute threads
   while tokens stream. Reports the medians and the ratios daemon / in-process.
2. Through the daemon: time to first token and the gap between consecutive batches as the client
   receives them (p50/p99; one token per batch with --daemon-arg=--stream-interval=0) for one stream.
3. Aggregate generated tokens/s with 1, 4 and 16 concurrent streams (one connection each), next to
   llama.cpp (llama-cpp-python's library, which serves one sequence at a time: the same requests in a loop).

Usage: bench_daemon.py [--model M] [--threads 2] [--gen 128] [--rounds 5] [--streams 1 4 16] [--no-llamacpp]
                       [--daemon-arg=--steps-in-flight=1 ...]
Needs: build/bin/inferd, build/bin/inferd-worker, build/tools/inferd-bench, pycapnp; llama-cpp-python for (3).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

from common import running_daemon

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."

# pycapnp is imported only in the daemon half: llama-cpp-python crashes in a process that loaded it.
capnp = None
api = None
Sink = None


def load_capnp():
    global capnp, api, Sink
    import capnp as capnp_module
    capnp = capnp_module
    api = capnp.load(os.path.join(ROOT, "schemas", "inferd.capnp"), imports=["/usr/include"])

    class _Sink(api.TokenSink.Server):
        def __init__(self):
            self.arrivals = []  # (time, tokens in the batch)

        async def send(self, batch, **kwargs):
            self.arrivals.append((time.perf_counter(), len(batch.tokens)))

        async def done(self, **kwargs):
            pass

    Sink = _Sink


async def connect(path):
    stream = await capnp.AsyncIoStream.create_unix_connection(path)
    client = capnp.TwoPartyClient(stream)
    daemon = client.bootstrap().cast_as(api.Daemon)
    await daemon.hello(api.protocolVersion, "bench_daemon")
    return client, daemon


async def generate(inference, n, seed, sink):
    req = {"model": "bench", "input": {"prompt": PROMPT}, "maxTokens": n, "ignoreEog": True,
           "sampling": {"temperature": 0.0, "seed": seed}}
    return (await inference.generate(req, sink)).result


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def http_stream(path, n, seed):
    """Decode tok/s of one streamed /v1/completions over the HTTP unix socket, from the client's arrival
    times of the first and last text events; and the generated token count from the usage event."""
    import http.client
    import socket as socket_module

    class Conn(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_STREAM)
            self.sock.connect(path)

    conn = Conn("localhost", timeout=300)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"model": "bench", "prompt": PROMPT, "max_tokens": n, "temperature": 0, "seed": seed, "ignore_eos": True,
         "stream": True, "stream_options": {"include_usage": True}}), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    times, generated = [], None
    while True:
        line = r.readline()
        if not line or line.strip() == b"data: [DONE]":
            break
        if not line.startswith(b"data: "):
            continue
        event = json.loads(line[6:])
        if event.get("usage"):
            generated = event["usage"]["completion_tokens"]
        elif event["choices"] and event["choices"][0]["text"]:
            times.append(time.perf_counter())
    conn.close()
    return (generated - 1) / (times[-1] - times[0])


async def daemon_rounds(path, args, inproc_results, decode_cpp, decode_http):
    client, daemon = await connect(path)
    admin = (await daemon.admin()).admin
    inference = (await daemon.inference()).inference
    await admin.load(os.path.abspath(args.model),
                     {"id": "bench", "threads": args.threads, "parallel": max(args.streams), "contextSize": 1024})
    await generate(inference, 8, 0, Sink())  # warm-up
    decode, ttft, gaps, per_batch = [], [], [], []
    for r in range(args.rounds):
        # In-process, then through the daemon, alternately.
        out = subprocess.run([os.path.join(args.build, "tools", "inferd-bench"), "-m", args.model, "-p", "16",
                              "-n", str(args.gen), "-r", "1", "-t", str(args.threads), "--json"],
                             check=True, capture_output=True, text=True, cwd=ROOT).stdout
        inproc_results.append(json.loads(out.strip().splitlines()[-1])["decode_tps"])
        cpp = json.loads(subprocess.run(
            [os.path.join(args.build, "bin", "inferctl"), "--socket", path, "--json", "generate", "-m", "bench",
             "-n", str(args.gen), "--temp", "0", "--seed", str(r), "--ignore-eog", "-q", "-p", PROMPT],
            check=True, capture_output=True, text=True).stdout)["result"]
        decode_cpp.append((cpp["generated_tokens"] - 1) * 1000.0 / cpp["generate_ms"])
        decode_http.append(http_stream(os.path.join(os.path.dirname(path), "inferd-http.sock"), args.gen, r))
        sink = Sink()
        res = await generate(inference, args.gen, r, sink)
        decode.append((res.generatedTokens - 1) * 1000.0 / res.generateMs)
        ttft.append(res.timeToFirstTokenMs)
        t = [a[0] for a in sink.arrivals]
        gaps += [(b - a) * 1000.0 for a, b in zip(t, t[1:])]
        per_batch.append(sum(a[1] for a in sink.arrivals) / max(1, len(sink.arrivals)))
        print(f"round {r}: in-process {inproc_results[-1]:.1f} tok/s, daemon with the C++ client "
              f"{decode_cpp[-1]:.1f} tok/s, with pycapnp {decode[-1]:.1f} tok/s, over HTTP {decode_http[-1]:.1f} tok/s",
              file=sys.stderr)
    streams = {}
    for n in args.streams:
        conns = [await connect(path) for _ in range(n)]
        infs = [(await d.inference()).inference for _, d in conns]
        t0 = time.perf_counter()
        results = await asyncio.gather(*[generate(inf, args.gen, i, Sink()) for i, inf in enumerate(infs)])
        wall = time.perf_counter() - t0
        total = sum(r.generatedTokens for r in results)
        streams[n] = total / wall
        print(f"{n} streams: {streams[n]:.1f} tok/s aggregate", file=sys.stderr)
    await admin.unload("bench")
    return decode, ttft, gaps, streams, statistics.mean(per_batch)


def llamacpp_streams(args):
    """Runs llama.cpp in a child process (llama-cpp-python and pycapnp do not share a process well:
    the interpreter can crash at exit) and returns {streams: tok/s}."""
    cmd = [sys.executable, os.path.abspath(__file__), "--llamacpp-child", "--model", args.model, "--threads",
           str(args.threads), "--gen", str(args.gen), "--streams", *map(str, args.streams)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        return None
    return {int(k): v for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items()}


def llamacpp_child(args):
    try:
        from llama_cpp import Llama
    except ImportError:
        sys.exit(1)
    llm = Llama(model_path=args.model, n_threads=args.threads, n_ctx=1024, verbose=False)
    llm(PROMPT, max_tokens=8, temperature=0.0)
    out = {}
    for n in args.streams:
        t0 = time.perf_counter()
        total = 0
        for _ in range(n):
            # llama-cpp-python has no ignore-EOS switch: the tokens actually generated are counted.
            r = llm.create_completion(PROMPT, max_tokens=args.gen, temperature=0.0)
            total += r["usage"]["completion_tokens"]
        out[n] = total / (time.perf_counter() - t0)
        print(f"llama.cpp {n} requests in a loop: {out[n]:.1f} tok/s", file=sys.stderr)
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--daemon-arg", action="append", default=[],
                    help="extra inferd flag, repeatable (e.g. --daemon-arg=--steps-in-flight=1)")
    ap.add_argument("--llamacpp-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llamacpp_child:
        llamacpp_child(args)
        return 0

    load_capnp()
    with running_daemon(args.build, *args.daemon_arg) as (_, path):
        inproc, decode_cpp, decode_http = [], [], []
        decode, ttft, gaps, streams, per_batch = asyncio.run(
            capnp.run(daemon_rounds(path, args, inproc, decode_cpp, decode_http)))
    llama = None if args.no_llamacpp else llamacpp_streams(args)

    d, c, i = statistics.median(decode), statistics.median(decode_cpp), statistics.median(inproc)
    # Each round's own ratio too: rounds run back to back, so a neighbour's load hits both sides alike.
    rc = statistics.median(b / a for a, b in zip(inproc, decode_cpp))
    rp = statistics.median(b / a for a, b in zip(inproc, decode))
    h = statistics.median(decode_http)
    rh = statistics.median(b / a for a, b in zip(inproc, decode_http))
    print(f"\nmodel {os.path.basename(args.model)}, {args.threads} threads, {args.gen} generated tokens, "
          f"{args.rounds} rounds alternating")
    print(f"| decode tok/s (median) | in-process | daemon, C++ client | ratio | daemon, pycapnp client | ratio | "
          f"daemon, HTTP streaming | ratio |\n"
          f"|---|---|---|---|---|---|---|---|\n"
          f"| {os.path.basename(args.model)} | {i:.1f} | {c:.1f} | {c / i:.3f} | {d:.1f} | {d / i:.3f} | {h:.1f} | "
          f"{h / i:.3f} |")
    print(f"median of the rounds' own ratios: C++ client {rc:.3f}, pycapnp client {rp:.3f}, HTTP {rh:.3f}")
    print(f"\ntime to first token (prompt {len(PROMPT)} chars): median {statistics.median(ttft):.1f} ms; "
          f"gap between batches at the client: p50 {percentile(gaps, 50):.2f} ms, p99 {percentile(gaps, 99):.2f} ms, "
          f"{per_batch:.2f} tokens per batch")
    print("\n| concurrent streams | inferd aggregate tok/s | llama.cpp (library, requests in a loop) tok/s |\n|---|---|---|")
    for n in args.streams:
        print(f"| {n} | {streams[n]:.1f} | {llama[n]:.1f} |" if llama else f"| {n} | {streams[n]:.1f} | n/a |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
