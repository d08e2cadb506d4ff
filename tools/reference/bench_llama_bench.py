#!/usr/bin/env python3
"""inferd-bench against llama.cpp's own llama-bench, alternating in one run on the same file and threads.

Each round runs `inferd-bench -p P -n N -t T -r 1 --json`, then `llama-bench -p P -n N -t T -r 1 -o json`
(llama-bench's defaults otherwise: weight repacking and flash attention as it chooses), so both see the same
machine state; the figures are medians over the rounds, and the ratios are inferd / llama.cpp. The CPU model and
the instruction sets both programs use are printed with them.

    python3 tools/reference/bench_llama_bench.py --model models/gemma-3-270m-q4_k_m.gguf [--rounds 5]
        [--inferd-bench build/tools/inferd-bench] [--llama-bench ~/.cache/inferd-ref/llama/bin/llama-bench]

llama-bench is built by ../shared/reference/llama-tools.sh (llama.cpp vendored in llama-cpp-python 0.3.36).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def run_inferd(exe: str, model: str, p: int, n: int, t: int) -> dict:
    out = subprocess.run([exe, "-m", model, "-p", str(p), "-n", str(n), "-t", str(t), "-r", "1", "--json"],
                         check=True, capture_output=True, text=True).stdout
    d = json.loads(out.strip().splitlines()[-1])
    return {"pp": d["prefill_tps"], "tg": d["decode_tps"], "isa": d["isa"]}


def run_llama(exe: str, model: str, p: int, n: int, t: int) -> dict:
    out = subprocess.run([exe, "-m", model, "-p", str(p), "-n", str(n), "-t", str(t), "-r", "1", "-o", "json"],
                         check=True, capture_output=True, text=True).stdout
    res = {}
    for row in json.loads(out):
        res["pp" if row["n_gen"] == 0 else "tg"] = row["avg_ts"]
        res["cpu_info"] = row.get("cpu_info", "")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--inferd-bench", default=os.path.join(ROOT, "build", "tools", "inferd-bench"))
    ap.add_argument("--llama-bench", default=os.path.expanduser("~/.cache/inferd-ref/llama/bin/llama-bench"))
    args = ap.parse_args()
    for exe in (args.inferd_bench, args.llama_bench):
        if not os.access(exe, os.X_OK):
            sys.exit(f"{exe} is missing (build inferd-bench; ../shared/reference/llama-tools.sh builds llama-bench)")

    inferd, llama = [], []
    for r in range(args.rounds):
        inferd.append(run_inferd(args.inferd_bench, args.model, args.prompt, args.gen, args.threads))
        llama.append(run_llama(args.llama_bench, args.model, args.prompt, args.gen, args.threads))
        print(f"round {r + 1}: inferd pp{args.prompt} {inferd[-1]['pp']:.1f} tg{args.gen} {inferd[-1]['tg']:.1f} | "
              f"llama-bench pp{args.prompt} {llama[-1]['pp']:.1f} tg{args.gen} {llama[-1]['tg']:.1f}", file=sys.stderr)

    med = lambda rows, k: statistics.median(x[k] for x in rows)  # noqa: E731
    summary = {
        "model": os.path.relpath(os.path.abspath(args.model), ROOT), "threads": args.threads,
        "cpu": cpu_model(), "inferd_isa": inferd[0]["isa"], "llama_cpu_info": llama[0].get("cpu_info", ""),
        "rounds": args.rounds,
        "inferd": {"pp": med(inferd, "pp"), "tg": med(inferd, "tg")},
        "llama_bench": {"pp": med(llama, "pp"), "tg": med(llama, "tg")},
    }
    summary["ratio"] = {k: summary["inferd"][k] / summary["llama_bench"][k] for k in ("pp", "tg")}
    print(f"{summary['model']} on {summary['cpu']} ({summary['inferd_isa']}), {args.threads} threads, "
          f"medians of {args.rounds} alternated rounds:")
    print(f"  prefill pp{args.prompt}: inferd {summary['inferd']['pp']:.1f} / llama-bench "
          f"{summary['llama_bench']['pp']:.1f} tok/s = {summary['ratio']['pp']:.2f}x")
    print(f"  decode  tg{args.gen}:  inferd {summary['inferd']['tg']:.1f} / llama-bench "
          f"{summary['llama_bench']['tg']:.1f} tok/s = {summary['ratio']['tg']:.2f}x")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
