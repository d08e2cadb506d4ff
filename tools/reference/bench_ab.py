#!/usr/bin/env python3
"""Two builds of inferd side by side: prefill and decode of the in-process engine (inferd-bench) and decode
through the daemon, alternating old and new round by round in one run, so that the machine's drift hits
both alike. For "speed unchanged" claims across a refactor.

Usage: bench_ab.py --old OLD_BUILD --new NEW_BUILD [--models M ...] [--rounds 7] [--threads 2]
                   [--prompt 128] [--gen 64] [--daemon-gen 128] [--no-daemon]

A build directory has tools/inferd-bench and bin/{inferd,inferd-worker}; the new build's bin/inferctl is
the client for both daemons (the API is the same). Per model it prints every round, then the medians, the
ratio of the medians (new / old) and the median of the rounds' own ratios, as a markdown table row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from common import REPO_ROOT, running_daemon

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def bench(build: str, model: str, args) -> dict:
    out = subprocess.run([os.path.join(build, "tools", "inferd-bench"), "-m", model, "-t", str(args.threads),
                          "-p", str(args.prompt), "-n", str(args.gen), "-r", "1", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def daemon_decode(build: str, client: str, model: str, args) -> float:
    with running_daemon(build, "--threads", str(args.threads)) as (_, sock):
        base = [client, "--socket", sock]
        subprocess.run(base + ["load", model, "--id", "ab", "--parallel", "1"], check=True, capture_output=True)
        subprocess.run(base + ["generate", "-m", "ab", "-p", "Hello", "-n", "8"], check=True, capture_output=True)
        out = subprocess.run(base + ["--json", "generate", "-m", "ab", "-p", PROMPT, "-n", str(args.daemon_gen),
                                     "--temp", "0", "--ignore-eog", "-q"], check=True, capture_output=True,
                             text=True).stdout
        r = json.loads(out)["result"]
        return (r["generated_tokens"] - 1) * 1000.0 / r["generate_ms"]


def summarize(name: str, old: list[float], new: list[float]) -> str:
    ratios = [n / o for o, n in zip(old, new)]
    mo, mn = statistics.median(old), statistics.median(new)
    return (f"| {name} | {mo:.1f} | {mn:.1f} | **{mn / mo:.3f}** | {statistics.median(ratios):.3f} | "
            f"{min(ratios):.3f}-{max(ratios):.3f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", default=os.path.join(REPO_ROOT, "build"))
    ap.add_argument("--models", nargs="+", default=[os.path.join(REPO_ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--daemon-gen", type=int, default=128)
    ap.add_argument("--no-daemon", action="store_true")
    args = ap.parse_args()
    client = os.path.join(args.new, "bin", "inferctl")
    rows = []
    for model in args.models:
        res = {k: {"old": [], "new": []} for k in ("prefill", "decode", "daemon")}
        for r in range(args.rounds):
            # Alternate which build goes first, so neither always runs on a warmer machine.
            order = [("old", args.old), ("new", args.new)] if r % 2 == 0 else [("new", args.new), ("old", args.old)]
            for side, build in order:
                b = bench(build, model, args)
                res["prefill"][side].append(b["prefill_tps"])
                res["decode"][side].append(b["decode_tps"])
                if not args.no_daemon:
                    res["daemon"][side].append(daemon_decode(build, client, model, args))
            line = " | ".join(f"{k} old {v['old'][-1]:.1f} new {v['new'][-1]:.1f}" for k, v in res.items() if v["old"])
            print(f"{os.path.basename(model)} round {r}: {line}", file=sys.stderr, flush=True)
        name = os.path.basename(model)
        rows.append(summarize(f"{name} prefill pp{args.prompt}", res["prefill"]["old"], res["prefill"]["new"]))
        rows.append(summarize(f"{name} decode tg{args.gen}", res["decode"]["old"], res["decode"]["new"]))
        if not args.no_daemon:
            rows.append(summarize(f"{name} daemon decode {args.daemon_gen}", res["daemon"]["old"], res["daemon"]["new"]))
    print("| measure (tok/s) | old | new | new / old (medians) | median of round ratios | round ratios |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
