#!/usr/bin/env python3
"""Measures llama.cpp's CPU prefill and decode speed and memory, as the baseline inferd is compared with.

Method (llama.cpp's low-level C API through llama-cpp-python, so Python adds no per-token work beyond one argmax):
  - Context: n_ctx = prompt + gen, n_batch = n_ubatch = prompt, n_threads = n_threads_batch = --threads, llama.cpp
    defaults otherwise (mmap on, F16 KV cache; flash attention per --flash-attn, default "auto").
  - Prompt: the first `--prompt` tokens of tests/data/text/english.txt (model's tokenizer, BOS if the model adds it).
  - One untimed warm-up rep, then `--reps` timed reps. Each rep clears the KV cache, then
      prefill: one llama_decode of the whole prompt (logits for the last position only);
      decode:  `--gen` greedy steps, each one llama_decode of one token followed by an argmax of its logits.
  - Reported: median over reps of prompt/prefill_seconds and gen/decode_seconds, plus VmRSS, RssAnon and RssFile
    (KiB, from /proc/self/status) after all reps. RssFile counts the mmap'ed weights pages touched.

Usage: bench_llamacpp.py --model M [--threads 2] [--prompt 128] [--gen 64] [--reps 3] [--json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def proc_status_kib() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[key] = int(rest.split()[0])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--text", default=os.path.join(common.REPO_ROOT, "tests", "data", "text", "english.txt"))
    ap.add_argument("--flash-attn", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    args = ap.parse_args()

    import llama_cpp as L

    # ctypes does not keep the callback alive: it must outlive every llama.cpp call, hence a local kept to the end
    quiet_log = L.llama_log_callback(lambda level, text, user: None)
    if args.json:
        L.llama_log_set(quiet_log, ctypes.c_void_p(0))
    L.llama_backend_init()
    mparams = L.llama_model_default_params()
    model = L.llama_model_load_from_file(args.model.encode(), mparams)
    if not model:
        print(f"cannot load {args.model}", file=sys.stderr)
        return 1
    cparams = L.llama_context_default_params()
    cparams.n_ctx = args.prompt + args.gen
    cparams.n_batch = args.prompt
    cparams.n_ubatch = args.prompt
    cparams.n_threads = args.threads
    cparams.n_threads_batch = args.threads
    cparams.flash_attn_type = {"auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                               "off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED}[args.flash_attn]
    ctx = L.llama_init_from_model(model, cparams)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)

    with open(args.text, "rb") as f:
        text = f.read()
    buf = (L.llama_token * (len(text) + 16))()
    n = L.llama_tokenize(vocab, text, len(text), buf, len(buf), True, False)
    if n < args.prompt:
        print(f"text has only {n} tokens", file=sys.stderr)
        return 1
    prompt = list(buf[: args.prompt])

    batch = L.llama_batch_init(max(args.prompt, 1), 0, 1)

    def decode(tokens: list[int], pos0: int) -> None:
        batch.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            batch.token[i] = t
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == len(tokens) - 1
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def argmax_last() -> int:
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        return int(np.argmax(logits))

    def one_rep() -> tuple[float, float, list[int]]:
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        t0 = time.perf_counter()
        decode(prompt, 0)
        t1 = time.perf_counter()
        tok = argmax_last()
        out = []
        t2 = time.perf_counter()
        for i in range(args.gen):
            out.append(tok)
            decode([tok], args.prompt + i)
            tok = argmax_last()
        t3 = time.perf_counter()
        return t1 - t0, t3 - t2, out

    one_rep()  # warm-up: page in the weights, size the compute buffers
    prefill, dec, generated = [], [], None
    for _ in range(args.reps):
        p, d, generated = one_rep()
        prefill.append(p)
        dec.append(d)

    result = {
        "engine": common.llama_cpp_version(),
        "model": os.path.basename(args.model),
        "model_sha256": common.sha256_file(args.model),
        "threads": args.threads,
        "prompt_tokens": args.prompt,
        "gen_tokens": args.gen,
        "reps": args.reps,
        "flash_attn": args.flash_attn,
        "prefill_tok_s": args.prompt / statistics.median(prefill),
        "decode_tok_s": args.gen / statistics.median(dec),
        "prefill_s": prefill,
        "decode_s": dec,
        "generated_head": generated[:16],
        "rss_kib": proc_status_kib(),
        # llama.cpp's threads spin: other processes on the same cores distort the figures badly; judge by this
        "loadavg_1m_after": os.getloadavg()[0],
        "system_info": L.llama_print_system_info().decode().strip(),
    }
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    del quiet_log
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
