#!/usr/bin/env python3
"""Side-by-side speed and memory of inferd and llama.cpp on the same files, same threads, in one run.

For each model, the two engines are run alternately (--rounds times; each run itself reports the median of
--reps repetitions), so that drifting load on a shared machine hits both alike; the table reports the median
over rounds and the ratio inferd / llama.cpp. The memory read bandwidth of the machine is probed first
(build/tools/inferd-bandwidth), since decode is bound by it: "decode GB/s" is weight bytes x tokens/s.

Usage: compare_llamacpp.py [--models A.gguf B.gguf] [--threads 2] [--prompt 128] [--gen 64] [--reps 3] [--rounds 3]
Needs: build/tools/inferd-bench, build/tools/inferd-bandwidth, llama-cpp-python (pip).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_json(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["models/SmolLM2-135M-Instruct.Q4_1.gguf",
                                                    "models/tinyllama-q4_0-synthetic.gguf"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--build", default="build")
    ap.add_argument("--weights", default="shm", choices=["shm", "mmap"],
                    help="inferd's weights: a shared-memory copy with 2 MiB pages (as in the daemon) or the file mapped")
    args = ap.parse_args()

    bw = subprocess.run([f"{args.build}/tools/inferd-bandwidth", "--threads", str(args.threads)], check=True,
                        capture_output=True, text=True, cwd=ROOT).stdout.strip()
    print(f"bandwidth probe: {bw}")
    best_bw = float(bw.split("best ")[1].split(" GB/s")[0])

    rows = []
    for model in args.models:
        if not os.path.exists(os.path.join(ROOT, model)):
            print(f"skipping {model}: not found", file=sys.stderr)
            continue
        ours, ref = [], []
        for _ in range(args.rounds):
            ours.append(run_json([f"{args.build}/tools/inferd-bench", "-m", model, "-t", str(args.threads), "-p",
                                  str(args.prompt), "-n", str(args.gen), "-r", str(args.reps), "--weights", args.weights,
                                  "--json"]))
            ref.append(run_json([sys.executable, "tools/reference/bench_llamacpp.py", "--model", model, "--threads",
                                 str(args.threads), "--prompt", str(args.prompt), "--gen", str(args.gen), "--reps",
                                 str(args.reps), "--json"]))
        med = lambda xs: statistics.median(xs)  # noqa: E731
        o_pp, o_tg = med([r["prefill_tps"] for r in ours]), med([r["decode_tps"] for r in ours])
        l_pp, l_tg = med([r["prefill_tok_s"] for r in ref]), med([r["decode_tok_s"] for r in ref])
        gb = ours[0]["weights_bytes"] / 1e9
        rows.append({
            "model": os.path.basename(model), "prefill_inferd": o_pp, "prefill_llama": l_pp,
            "decode_inferd": o_tg, "decode_llama": l_tg, "decode_gbps": o_tg * gb, "bw_frac": o_tg * gb / best_bw,
            "anon_inferd_mib": med([r["rss_anon_kib"] for r in ours]) / 1024,
            "anon_llama_mib": med([r["rss_kib"]["RssAnon"] for r in ref]) / 1024,
        })

    print(f"\nthreads {args.threads}, prompt {args.prompt}, gen {args.gen}, reps {args.reps}, rounds {args.rounds}, "
          f"inferd weights: {args.weights} (llama.cpp: the file mapped)\n")
    print("| model | prefill inferd | prefill llama.cpp | ratio | decode inferd | decode llama.cpp | ratio "
          "| decode GB/s (of probe) | RssAnon inferd | RssAnon llama.cpp |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['prefill_inferd']:.1f} | {r['prefill_llama']:.1f} | "
              f"{r['prefill_inferd'] / r['prefill_llama']:.2f}x | {r['decode_inferd']:.1f} | {r['decode_llama']:.1f} | "
              f"{r['decode_inferd'] / r['decode_llama']:.2f}x | {r['decode_gbps']:.1f} ({100 * r['bw_frac']:.0f}%) | "
              f"{r['anon_inferd_mib']:.1f} MiB | {r['anon_llama_mib']:.1f} MiB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
