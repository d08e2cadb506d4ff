#!/usr/bin/env python3
"""What the prefix cache saves: time to first token of a growing chat, and a shared system prompt.

Starts build/bin/inferd (2 compute threads) and runs, through the Cap'n Proto API:

  chat    (--chat-model, default the 1.1B synthetic model) a --turns-turn conversation sent as token ids:
          each turn is the whole history (every earlier user message and reply) plus a new user message
          of --user tokens; the reply is --reply greedy tokens (ignore_eog). The history reaches about
          turns x (user + reply) tokens. Run twice, cachePrompt off then on, on one loaded model (the
          cache-off run publishes nothing). Prints each turn's prompt length, time to first token off and
          on, the tokens the cache supplied, and the ratio; checks the replies are identical.
  shared  (--shared-model, default SmolLM2) --requests requests at once, each a --system-token system
          prompt shared by all plus --unique tokens of its own, one generated token each, on a model with
          4 slots: aggregate prompt tokens/s (all prompt tokens / wall time) and the median and worst
          time to first token, cache off and on (fresh model ids, so nothing is cached before a run).

Usage: bench_prefix_cache.py [--bin-dir build/bin] [--chat-model M] [--shared-model M] [--turns 10]
                             [--user 40] [--reply 160] [--requests 16] [--system-tokens 1000] [--unique 50]
                             [--skip-chat] [--skip-shared]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))

import harness  # noqa: E402
from harness import Connection, request, run_async  # noqa: E402


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


async def chat(conn: Connection, model_id: str, args, cache: bool, rng_seed: int):
    rng = random.Random(rng_seed)
    history: list[int] = []
    rows = []
    for turn in range(args.turns):
        history += [rng.randrange(100, 30000) for _ in range(args.user)]
        req = request(model_id, tokens=list(history), max_tokens=args.reply, ignoreEog=True, cachePrompt=cache)
        out = await conn.generate(req)
        assert out.error is None, out.error
        assert len(out.tokens) == args.reply, out
        rows.append((len(history), out.result.timeToFirstTokenMs, out.result.cachedTokens, list(out.tokens)))
        history += list(out.tokens)
    return rows


async def shared(conn: Connection, model_id: str, args, cache: bool):
    rng = random.Random(7)
    system = [rng.randrange(100, 30000) for _ in range(args.system_tokens)]
    reqs = [request(model_id, tokens=system + [rng.randrange(100, 30000) for _ in range(args.unique)], max_tokens=1,
                    ignoreEog=True, cachePrompt=cache) for _ in range(args.requests)]
    t0 = time.perf_counter()
    outs = await asyncio.gather(*[conn.start_generate(r) for r in reqs])
    wall = time.perf_counter() - t0
    for o in outs:
        assert o.error is None, o.error
    ttft = [o.result.timeToFirstTokenMs for o in outs]
    cached = sum(o.result.cachedTokens for o in outs)
    prompt = sum(o.result.promptTokens for o in outs)
    return prompt / wall, statistics.median(ttft), max(ttft), cached, prompt, wall


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--chat-model", default=os.path.join(ROOT, "models", "tinyllama-q4_0-synthetic.gguf"))
    ap.add_argument("--shared-model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--user", type=int, default=40)
    ap.add_argument("--reply", type=int, default=160)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--unique", type=int, default=50)
    ap.add_argument("--skip-chat", action="store_true")
    ap.add_argument("--skip-shared", action="store_true")
    args = ap.parse_args()
    harness.Config.bin_dir = args.bin_dir
    print(f"CPU: {cpu_model()}, 2 compute threads")
    daemon = harness.Daemon(threads=2).start()
    try:
        async def body():
            conn = await Connection.open(daemon.socket_path)
            if not args.skip_chat:
                ctx = 4096
                await conn.load(args.chat_model, id="chat", contextSize=ctx, parallel=1)
                off = await chat(conn, "chat", args, False, 1)
                on = await chat(conn, "chat", args, True, 1)
                print(f"\nchat on {os.path.basename(args.chat_model)}: {args.turns} turns, {args.user} user tokens "
                      f"and {args.reply} reply tokens each")
                print("turn  prompt  TTFT off (ms)  TTFT on (ms)  cached  speed-up")
                for i, (a, b) in enumerate(zip(off, on)):
                    assert a[3] == b[3], f"turn {i + 1}: the reply differs with the cache"
                    print(f"{i + 1:4d}  {a[0]:6d}  {a[1]:13.0f}  {b[1]:12.0f}  {b[2]:6d}  {a[1] / b[1]:7.1f}x")
                print("replies identical with the cache off and on: yes")
                await conn.unload("chat")
            if not args.skip_shared:
                print(f"\nshared system prompt on {os.path.basename(args.shared_model)}: {args.requests} requests "
                      f"at once, {args.system_tokens} shared + {args.unique} own tokens, 4 slots")
                print("cache  prompt tok/s  TTFT median (ms)  TTFT worst (ms)  cached/prompt tokens  wall (s)")
                for cache in (False, True):
                    mid = f"shared-{int(cache)}"
                    await conn.load(args.shared_model, id=mid, contextSize=2048, parallel=4)
                    rate, med, worst, cached, prompt, wall = await shared(conn, mid, args, cache)
                    print(f"{'on' if cache else 'off':5s}  {rate:12.0f}  {med:16.0f}  {worst:15.0f}  "
                          f"{cached:>9d}/{prompt:<10d}  {wall:8.2f}")
                    await conn.unload(mid)
            conn.close()

        run_async(body(), daemons=[daemon])
    finally:
        daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
