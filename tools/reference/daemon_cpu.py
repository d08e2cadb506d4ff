#!/usr/bin/env python3
"""CPU that the daemon and its client spend per generated token, next to the decode rate.

Starts inferd (with the given extra flags), loads the model with 2 compute threads, and runs --rounds greedy
generations of --gen tokens through `inferctl generate`. For each: decode tok/s (the daemon's own
first-to-last-token time), the CPU time of all the daemon's threads (their /proc schedstat; the workers are
separate processes and not counted) and of the client (wait4 rusage) divided by the tokens, and the
client's voluntary context switches per token (one per wake-up).

Usage: daemon_cpu.py [--model M] [--gen 1024] [--rounds 3] [--daemon-arg=--stream-interval=0 ...]
Run it alternately with different flags to compare, e.g. --stream-interval=0 against the default.
"""

import argparse
import glob
import json
import os
import subprocess

from common import running_daemon

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--gen", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--daemon-arg", action="append", default=[])
    args = ap.parse_args()

    with running_daemon(args.build, *args.daemon_arg, prefix="inferd-cpu-") as (daemon, sock):
        ctl = [os.path.join(args.build, "bin", "inferctl"), "--socket", sock]
        subprocess.run(ctl + ["load", args.model, "--id", "m", "--threads", "2", "--parallel", "16", "--ctx",
                              str(max(2048, args.gen + 64))], capture_output=True, check=True)

        def daemon_cpu_ns():
            total = 0
            for f in glob.glob(f"/proc/{daemon.pid}/task/*/schedstat"):
                try:
                    total += int(open(f).read().split()[0])
                except OSError:
                    pass  # a thread that just ended
            return total

        gen = ctl + ["--json", "generate", "-m", "m", "-n", str(args.gen), "--temp", "0", "--ignore-eog", "-q", "-p",
                     "Write a long story about a lighthouse keeper."]
        subprocess.run(gen, capture_output=True, check=True)  # warm-up
        for _ in range(args.rounds):
            before = daemon_cpu_ns()
            p = subprocess.Popen(gen, stdout=subprocess.PIPE, text=True)
            out = p.stdout.read()
            _, _, ru = os.wait4(p.pid, 0)
            after = daemon_cpu_ns()
            r = json.loads(out)["result"]
            n = r["generated_tokens"]
            print(f"{' '.join(args.daemon_arg) or '(defaults)'}: {(n - 1) * 1000 / r['generate_ms']:.1f} tok/s, "
                  f"daemon {(after - before) / n / 1e3:.1f} us/token, client {(ru.ru_utime + ru.ru_stime) / n * 1e6:.1f} "
                  f"us/token, client wake-ups {ru.ru_nvcsw / n:.2f}/token", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
