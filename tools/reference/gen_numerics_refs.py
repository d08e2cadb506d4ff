#!/usr/bin/env python3
"""Records llama.cpp's per-position outputs on a text, as committed reference data for inferd's agreement tests.

Protocol (also stored in the JSON's "protocol" field):
  1. Tokenize the UTF-8 text with llama.cpp (`llama_tokenize`, add_special = true, parse_special = false): a BOS
     token is prepended only when the model's metadata asks for one (tokenizer.ggml.add_bos_token). The ids are
     stored ("tokens").
  2. Split the ids into consecutive chunks of `ctx` tokens (the last chunk may be shorter; a chunk of one token is
     dropped). No BOS is inserted at chunk starts.
  3. Evaluate each chunk from an empty KV cache in one batch (n_ctx = n_batch = ctx, logits for every position,
     n_threads = 2, flash attention off, F16 KV cache; --kernels default leaves llama.cpp's CPU matmul choices as
     they are out of the box, --kernels vec_dot turns weight repacking and the tiled K-quant GEMM off),
     positions 0..len-1.
  4. For each position i of a chunk record: top-1 token id, the top-1 and top-2 logits, and, for every position
     but the chunk's last, the natural-log probability of the actual next token (log-softmax of the logits).
  5. Perplexity = exp(mean NLL over all scored positions, i.e. all but the last of each chunk).

JSON layout: {"protocol", "llama_cpp_version", "llama_cpp_settings", "model": {path, sha256, size, add_bos}, "text": {path, sha256},
  "ctx", "tokens": [...], "chunks": [{"start", "len", "top1_id": [...], "top1_logit": [...],
  "top2_logit": [...], "next_logprob": [... len-1 values]}], "summary": {"n_tokens", "n_scored",
  "perplexity", "mean_nll", "median_top1_margin", "frac_margin_below_0.01", "frac_margin_below_0.1"}}
Logits are rounded to 6 significant digits.

Usage: gen_numerics_refs.py --model M --text tests/data/text/english.txt --ctx 512 --out tests/data/numerics/N.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

PROTOCOL = (
    "tokenize with llama.cpp (add_special=true: BOS only if the model's add_bos_token says so; parse_special=false); "
    "split ids into consecutive chunks of ctx tokens (last may be shorter; 1-token chunks dropped); evaluate each "
    "chunk from an empty KV cache in one batch with logits for all positions (n_ctx=n_batch=ctx, n_threads=2, "
    "flash attention off, F16 KV cache; matmul kernels as named in llama_cpp_settings.kernels); per "
    "position store top-1 id, top-1 and top-2 logits, and log-softmax probability of the actual next token (all but "
    "the chunk's last position); perplexity = exp(mean NLL over all scored positions)"
)


def _r(x: float) -> float:
    return float(f"{x:.6g}")


def log_softmax_rows(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--kernels", choices=["default", "vec_dot"], default="default",
                    help="default: llama.cpp's CPU backend as configured out of the box (weight repacking for "
                         "Q4_0/Q4_K, the tiled K-quant GEMM for batches of 8+ rows); vec_dot: both off "
                         "(use_extra_bufts = false, GGML_CPU_TILED_MM=0), so every matmul runs ggml's "
                         "per-row vec_dot kernels")
    ap.add_argument("--generation-command", default=None,
                    help="for synthetic models: the command that regenerates the model, stored in the JSON")
    args = ap.parse_args()

    if args.kernels == "vec_dot":
        # Read by ggml-cpu on its first tiled-eligible matmul (tiled/tiled.cpp), so set before loading.
        os.environ["GGML_CPU_TILED_MM"] = "0"

    import llama_cpp
    import llama_cpp.llama_cpp as llama_cpp_c

    if args.kernels == "vec_dot":
        # Llama() takes no switch for llama_model_params.use_extra_bufts, so wrap the default-params function it calls.
        default_params = llama_cpp_c.llama_model_default_params

        def params_without_repack():
            p = default_params()
            p.use_extra_bufts = False
            return p

        llama_cpp_c.llama_model_default_params = params_without_repack

    llm = llama_cpp.Llama(model_path=args.model, n_ctx=args.ctx, n_batch=args.ctx, n_ubatch=args.ctx,
                          logits_all=True, n_threads=args.threads, n_threads_batch=args.threads,
                          flash_attn=False, seed=0, verbose=False)
    with open(args.text, "rb") as f:
        text = f.read()
    tokens = llm.tokenize(text, add_bos=True, special=False)
    add_bos = str(llm.metadata.get("tokenizer.ggml.add_bos_token", "false")).lower() == "true"

    chunks = []
    nll = []
    margins = []
    for start in range(0, len(tokens), args.ctx):
        chunk = tokens[start:start + args.ctx]
        if len(chunk) < 2:
            continue
        llm.reset()
        llm.eval(chunk)
        logits = np.array(llm.scores[: len(chunk), :], dtype=np.float32)
        if not np.isfinite(logits).all():
            print(f"non-finite logits in chunk at {start}", file=sys.stderr)
            return 1
        top2 = np.argpartition(-logits, 1, axis=1)[:, :2]
        vals = np.take_along_axis(logits, top2, axis=1)
        order = np.argsort(-vals, axis=1, kind="stable")
        top2 = np.take_along_axis(top2, order, axis=1)
        vals = np.take_along_axis(vals, order, axis=1)
        # argpartition's tie order is unspecified: for an exact tie take the lower id, as a stable argmax does
        top1_id = np.argmax(logits, axis=1)
        lsm = log_softmax_rows(logits[:-1])
        next_lp = lsm[np.arange(len(chunk) - 1), np.array(chunk[1:])]
        nll.extend((-next_lp).tolist())
        margins.extend((vals[:, 0] - vals[:, 1]).tolist())
        chunks.append({
            "start": start,
            "len": len(chunk),
            "top1_id": top1_id.astype(int).tolist(),
            "top1_logit": [_r(v) for v in vals[:, 0]],
            "top2_logit": [_r(v) for v in vals[:, 1]],
            "next_logprob": [_r(v) for v in next_lp],
        })
        print(f"chunk {start}: {len(chunk)} tokens, running ppl {np.exp(np.mean(nll)):.4f}", file=sys.stderr)

    margins_np = np.array(margins)
    out = {
        "protocol": PROTOCOL,
        "llama_cpp_version": common.llama_cpp_version(),
        "llama_cpp_settings": {"n_ctx": args.ctx, "n_batch": args.ctx, "n_threads": args.threads,
                               "flash_attn": False, "type_k": "f16", "type_v": "f16",
                               "kernels": args.kernels,
                               "system_info": llama_cpp.llama_print_system_info().decode().strip()},
        "model": {
            "path": os.path.relpath(os.path.abspath(args.model), common.REPO_ROOT),
            "sha256": common.sha256_file(args.model),
            "size": os.path.getsize(args.model),
            "add_bos": add_bos,
        },
        "text": {"path": os.path.relpath(os.path.abspath(args.text), common.REPO_ROOT),
                 "sha256": common.sha256_file(args.text)},
        "ctx": args.ctx,
        "tokens": [int(t) for t in tokens],
        "chunks": chunks,
        "summary": {
            "n_tokens": len(tokens),
            "n_scored": len(nll),
            "perplexity": float(np.exp(np.mean(nll))),
            "mean_nll": float(np.mean(nll)),
            "median_top1_margin": float(np.median(margins_np)),
            "frac_margin_below_0.01": float(np.mean(margins_np < 0.01)),
            "frac_margin_below_0.1": float(np.mean(margins_np < 0.1)),
        },
    }
    if args.generation_command:
        out["model"]["generation_command"] = args.generation_command
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(json.dumps({"out": args.out, **out["summary"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
