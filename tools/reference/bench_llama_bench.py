#!/usr/bin/env python3
"""inferd-bench against llama.cpp's own llama-bench, alternating in one run on the same file and threads.

Each round runs `inferd-bench -p P -n N -t T -r 1 --json` (once per --variant), then `llama-bench -p P -n N -t T
-r 1 -o json` (llama-bench's defaults otherwise: weight repacking and flash attention as it chooses), then the
read-bandwidth probe `inferd-bandwidth --threads T`, so all see the same machine state; the figures are medians
over the rounds, and the ratios are inferd / llama.cpp. Also reported: inferd's decode weight traffic (weight
bytes x tokens/s) as a share of the probe, and each program's peak resident memory (ru_maxrss of the process:
anonymous memory, mapped file pages and, for inferd, the shared-memory weights segment). The CPU model and the
instruction sets both programs use are printed with them.

    python3 tools/reference/bench_llama_bench.py --model models/gemma-3-270m-q4_k_m.gguf [--rounds 5]
        [--inferd-bench build/tools/inferd-bench] [--llama-bench ~/.cache/inferd-ref/llama/bin/llama-bench]
        [--variant rows:INFERD_WEIGHTS_LAYOUT=rows] [--variant avx2:INFERD_ISA=avx2]

A --variant NAME:VAR=VALUE[,VAR=VALUE] runs inferd-bench once more per round with those environment variables
(the default run has none), e.g. the row layout of the weights or the AVX2 kernels on an AVX-512 CPU.

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


def run_child(cmd: list[str], env: dict | None = None) -> tuple[str, int]:
    """Runs cmd to completion; returns its stdout and its own peak resident memory in KiB."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, **(env or {})})
    chunks = []
    for chunk in iter(lambda: proc.stdout.read(65536), ""):
        chunks.append(chunk)
    _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed with status {proc.returncode}")
    return "".join(chunks), rusage.ru_maxrss


def run_inferd(exe: str, model: str, p: int, n: int, t: int, env: dict | None = None) -> dict:
    out, rss = run_child([exe, "-m", model, "-p", str(p), "-n", str(n), "-t", str(t), "-r", "1", "--json"], env)
    d = json.loads(out.strip().splitlines()[-1])
    return {"pp": d["prefill_tps"], "tg": d["decode_tps"], "isa": d["isa"], "gbps": d["decode_weight_gbps"],
            "rss_mib": rss / 1024}


def run_llama(exe: str, model: str, p: int, n: int, t: int) -> dict:
    out, rss = run_child([exe, "-m", model, "-p", str(p), "-n", str(n), "-t", str(t), "-r", "1", "-o", "json"])
    res = {"rss_mib": rss / 1024}
    for row in json.loads(out):
        res["pp" if row["n_gen"] == 0 else "tg"] = row["avg_ts"]
        res["cpu_info"] = row.get("cpu_info", "")
    return res


def run_probe(exe: str, t: int) -> float:
    out, _ = run_child([exe, "--threads", str(t), "--json"])
    return json.loads(out.strip().splitlines()[-1])["median_gbps"]


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, assigns = text.partition(":")
    env = {}
    for a in filter(None, assigns.split(",")):
        k, _, v = a.partition("=")
        env[k] = v
    return name, env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--inferd-bench", default=os.path.join(ROOT, "build", "tools", "inferd-bench"))
    ap.add_argument("--llama-bench", default=os.path.expanduser("~/.cache/inferd-ref/llama/bin/llama-bench"))
    ap.add_argument("--bandwidth", default=os.path.join(ROOT, "build", "tools", "inferd-bandwidth"))
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=VALUE[,VAR=VALUE]",
                    help="another inferd-bench run per round with these environment variables")
    args = ap.parse_args()
    for exe in (args.inferd_bench, args.llama_bench, args.bandwidth):
        if not os.access(exe, os.X_OK):
            sys.exit(f"{exe} is missing (build inferd-bench; ../shared/reference/llama-tools.sh builds llama-bench)")
    variants = [("inferd", {})] + [parse_variant(v) for v in args.variant]

    inferd = {name: [] for name, _ in variants}
    llama, probe = [], []
    for r in range(args.rounds):
        for name, env in variants:
            inferd[name].append(run_inferd(args.inferd_bench, args.model, args.prompt, args.gen, args.threads, env))
        llama.append(run_llama(args.llama_bench, args.model, args.prompt, args.gen, args.threads))
        probe.append(run_probe(args.bandwidth, args.threads))
        line = " | ".join(f"{name} pp{args.prompt} {inferd[name][-1]['pp']:.1f} tg{args.gen} {inferd[name][-1]['tg']:.1f}"
                          for name, _ in variants)
        print(f"round {r + 1}: {line} | llama-bench pp{args.prompt} {llama[-1]['pp']:.1f} tg{args.gen} "
              f"{llama[-1]['tg']:.1f} | probe {probe[-1]:.1f} GB/s", file=sys.stderr)

    med = lambda rows, k: statistics.median(x[k] for x in rows)  # noqa: E731
    probe_med = statistics.median(probe)
    summary = {
        "model": os.path.relpath(os.path.abspath(args.model), ROOT), "threads": args.threads,
        "cpu": cpu_model(), "llama_cpu_info": llama[0].get("cpu_info", ""), "rounds": args.rounds,
        "probe_gbps": probe_med,
        "llama_bench": {"pp": med(llama, "pp"), "tg": med(llama, "tg"), "max_rss_mib": max(x["rss_mib"] for x in llama)},
        "variants": {},
    }
    print(f"{summary['model']} on {summary['cpu']}, {args.threads} threads, medians of {args.rounds} alternated rounds "
          f"(read-bandwidth probe {probe_med:.1f} GB/s):")
    print(f"  llama-bench: pp{args.prompt} {summary['llama_bench']['pp']:.1f}, tg{args.gen} "
          f"{summary['llama_bench']['tg']:.1f} tok/s, max RSS {summary['llama_bench']['max_rss_mib']:.0f} MiB")
    for name, env in variants:
        rows = inferd[name]
        v = {"env": env, "isa": rows[0]["isa"], "pp": med(rows, "pp"), "tg": med(rows, "tg"),
             "decode_gbps": med(rows, "gbps"), "max_rss_mib": max(x["rss_mib"] for x in rows)}
        v["ratio"] = {k: v[k] / summary["llama_bench"][k] for k in ("pp", "tg")}
        v["decode_of_probe"] = v["decode_gbps"] / probe_med
        v["rss_ratio"] = v["max_rss_mib"] / summary["llama_bench"]["max_rss_mib"]
        summary["variants"][name] = v
        print(f"  {name} ({v['isa']}{', ' + ','.join(f'{k}={x}' for k, x in env.items()) if env else ''}): "
              f"pp{args.prompt} {v['pp']:.1f} = {v['ratio']['pp']:.2f}x, tg{args.gen} {v['tg']:.1f} = "
              f"{v['ratio']['tg']:.2f}x; decode reads {v['decode_gbps']:.1f} GB/s = {100 * v['decode_of_probe']:.0f}% "
              f"of the probe; max RSS {v['max_rss_mib']:.0f} MiB = {v['rss_ratio']:.2f}x")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
