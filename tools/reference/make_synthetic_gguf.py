#!/usr/bin/env python3
"""Writes llama-architecture GGUF models with random weights that llama.cpp loads and runs.

Purpose: test and benchmark models of real shapes and quantization mixes without downloading weights.

Presets
  tinyllama-q4_0   TinyLlama-1.1B shapes (n_embd 2048, 22 layers, 32 heads / 4 kv heads, ffn 5632, rope base
                   10000, rms eps 1e-5, context 2048). Every 2-D weight Q4_0 (token_embd too), output Q6_K, norms
                   F32 -- the types llama.cpp's Q4_0 quantization produces. Vocabulary: SmolLM2's gpt2/smollm BPE
                   vocabulary truncated to 32000 tokens (merges kept only when both parts and the result are among
                   them). ~640 MB.
  tinyllama-q4_k_m TinyLlama-1.1B shapes in a simplified Q4_K_M mix: attn_v and ffn_down Q6_K, the other
                   matrices and token_embd Q4_K, output Q6_K. ~680 MB.
  tinyllama-q8_0   TinyLlama-1.1B shapes, every 2-D weight Q8_0 (output too, as llama.cpp's Q8_0 files). ~1.2 GB.
  tinyllama-q3_k_m TinyLlama-1.1B shapes in a simplified Q3_K_M mix: attn_v and ffn_down Q4_K, the other matrices
                   and token_embd Q3_K, output Q6_K. ~550 MB.
  tinyllama-q2_k   The same with attn_v and ffn_down Q3_K, the rest and token_embd Q2_K, output Q6_K. ~450 MB.
  tinyllama-iq4_xs TinyLlama-1.1B shapes, every matrix and token_embd IQ4_XS, output Q6_K. ~620 MB.
  smollm2-f16      SmolLM2-135M's shapes, every matrix and the tied token_embd F16. ~270 MB.
  mixed-small      n_embd 256, 6 layers, 4 heads / 2 kv heads (head_dim 64), ffn 1024, rope base 10000, context
                   2048, full SmolLM2 vocabulary (49152). token_embd Q8_0, output Q6_K, the seven matrices of layer
                   L rotate through Q4_0, Q8_0, Q4_K, Q6_K: matrix k (attn_q, attn_k, attn_v, attn_output,
                   ffn_gate, ffn_up, ffn_down) of layer L has type [Q4_0, Q8_0, Q4_K, Q6_K][(L + k) % 4], so every
                   matrix kind meets every type and every layer mixes all four. ~27 MB. `--print-types` lists it.
  q4_0-small, q4_k-small, q6_k-small
                   mixed-small's shapes with every layer matrix of one type, token_embd and output Q8_0: isolates
                   one type's kernels when a mixed model disagrees with a reference.
  llama3-8b-q4_0   Llama-3-8B shapes (n_embd 4096, 32 layers, 32 / 8 heads, ffn 14336, rope base 500000, vocab
                   padded from SmolLM2's 49152 tokens to 128256 with unused tokens), all Q4_0, output Q6_K. ~4.6 GB.

How the weights are made (no float quantization: quant blocks are written directly, which is fast and exact)
  - Each quantized weight element is code * scale. Codes are i.i.d. draws from a discretized normal over the type's
    code range (Q4_0: q-8 in [-8,7], sigma 2.7; Q8_0: [-127,127], sigma 40; Q4_K: q-7.5 via dmin, q in [0,15],
    sigma 2.7; Q6_K: q-32 in [-32,31], sigma 10), sampled through a 65536-entry inverse-CDF table indexed by
    uniform uint16 draws. Codes are placed in ggml's block layouts (kernels/cpu/include/inferd/kernels/dtype.h).
  - Block scales: fp16 d = base * U(0.8, 1.2) per block (Q4_0 with a random sign, as real Q4_0 files have);
    Q4_K sub-block scales uniform in [40, 63] with mins equal to the scales and dmin = 7.5 d, so every sub-block
    is centred on zero; Q6_K int8 sub-block scales have random sign and magnitude in [64, 127]. `base` is chosen so
    that the dequantized weights have the target std.
  - Target stds: 1/sqrt(fan_in) for every projection (like a trained model's), token_embd 1.0, output
    kLogitScale/sqrt(n_embd) so logits have std ~kLogitScale and top-1/top-2 margins are clear; norms 1 + 0.1 N.
  - Everything comes from numpy's PCG64 with a fixed seed (`--seed`); on the same numpy/gguf versions the output is
    bit-for-bit reproducible (the file contains no time stamps).

Usage: make_synthetic_gguf.py --preset mixed-small --out tests/data/models/mixed-small.gguf [--seed 1234]
       make_synthetic_gguf.py --preset mixed-small --print-types
       make_synthetic_gguf.py --check FILE   (dequantizes every tensor with gguf.quants and prints its std/mean)
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402

kLogitScale = 4.0
kDefaultSeed = 1234
kQK = 32
kQK_K = 256


@dataclass
class Preset:
    name: str
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    rope_base: float
    rms_eps: float
    n_ctx: int
    token_embd_type: QT
    output_type: QT
    layer_types: list = field(default_factory=list)  # per matrix kind, or a callable(layer, k)
    file_type: int = 2  # LLAMA_FTYPE_MOSTLY_Q4_0
    arch: str = "llama"  # "qwen2": Q/K/V biases, NeoX RoPE (llama.cpp picks it by architecture), qwen2 pre-tokenizer;
                         # "qwen3": per-head Q/K norms; "gemma3": those, norms after attention and FFN, GeGLU,
                         # scaled embeddings, sliding-window layers; "phi3": fused attn_qkv and gate/up
    tied: bool = False   # no output.weight: token_embd is also the output projection (qwen2, qwen3, gemma3 always)
    head_dim: int = 0    # attention.key_length (0: n_embd / n_head)
    swa: int = 0         # gemma3: attention.sliding_window
    llama3_rope: bool = False  # rope_freqs.weight as Llama 3.1's conversion writes it (factor 8, 8192 original context)


kMatrixKinds = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
kMixedCycle = [QT.Q4_0, QT.Q8_0, QT.Q4_K, QT.Q6_K]
kLowBitCycle = [QT.Q2_K, QT.Q3_K, QT.IQ4_NL, QT.IQ4_XS]


def _uniform_q4_0(layer: int, k: int) -> QT:
    return QT.Q4_0


def _mixed(layer: int, k: int) -> QT:
    return kMixedCycle[(layer + k) % len(kMixedCycle)]


def _q4_k_m(layer: int, k: int) -> QT:
    # llama.cpp's Q4_K_M recipe, simplified: attn_v and ffn_down (k = 2, 6) get Q6_K, the rest Q4_K.
    return QT.Q6_K if k in (2, 6) else QT.Q4_K


def _uniform_q8_0(layer: int, k: int) -> QT:
    return QT.Q8_0


def _q3_k_m(layer: int, k: int) -> QT:
    # llama.cpp's Q3_K_M recipe, simplified: attn_v and ffn_down (k = 2, 6) get Q4_K, the rest Q3_K.
    return QT.Q4_K if k in (2, 6) else QT.Q3_K


def _q2_k(layer: int, k: int) -> QT:
    # llama.cpp's Q2_K recipe, simplified: attn_v and ffn_down (k = 2, 6) get Q3_K, the rest Q2_K.
    return QT.Q3_K if k in (2, 6) else QT.Q2_K


PRESETS = {
    "tinyllama-q4_0": Preset("tinyllama-q4_0", 2048, 22, 32, 4, 5632, 32000, 10000.0, 1e-5, 2048,
                             QT.Q4_0, QT.Q6_K, _uniform_q4_0),
    "tinyllama-q4_k_m": Preset("tinyllama-q4_k_m", 2048, 22, 32, 4, 5632, 32000, 10000.0, 1e-5, 2048,
                               QT.Q4_K, QT.Q6_K, _q4_k_m, file_type=15),  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    # llama.cpp's Q8_0 files keep the output in Q8_0 too.
    "tinyllama-q8_0": Preset("tinyllama-q8_0", 2048, 22, 32, 4, 5632, 32000, 10000.0, 1e-5, 2048,
                             QT.Q8_0, QT.Q8_0, _uniform_q8_0, file_type=7),
    # SmolLM2-135M's shapes with every matrix F16 and token_embd F16, tied (as its F16 release).
    "smollm2-f16": Preset("smollm2-f16", 576, 30, 9, 3, 1536, 49152, 100000.0, 1e-5, 8192,
                          QT.F16, QT.F16, lambda layer, k: QT.F16, file_type=1, tied=True),
    "tinyllama-q3_k_m": Preset("tinyllama-q3_k_m", 2048, 22, 32, 4, 5632, 32000, 10000.0, 1e-5, 2048,
                               QT.Q3_K, QT.Q6_K, _q3_k_m, file_type=12),  # LLAMA_FTYPE_MOSTLY_Q3_K_M
    "tinyllama-q2_k": Preset("tinyllama-q2_k", 2048, 22, 32, 4, 5632, 32000, 10000.0, 1e-5, 2048,
                             QT.Q2_K, QT.Q6_K, _q2_k, file_type=10),  # LLAMA_FTYPE_MOSTLY_Q2_K
    "tinyllama-iq4_xs": Preset("tinyllama-iq4_xs", 2048, 22, 32, 4, 5632, 32000, 10000.0, 1e-5, 2048,
                               QT.IQ4_XS, QT.Q6_K, lambda layer, k: QT.IQ4_XS, file_type=30),  # LLAMA_FTYPE_MOSTLY_IQ4_XS
    "mixed-small": Preset("mixed-small", 256, 6, 4, 2, 1024, 49152, 10000.0, 1e-5, 2048,
                          QT.Q8_0, QT.Q6_K, _mixed, file_type=7),  # "mostly Q8_0" is the closest ftype label
    # Qwen2 layout at a small size, all Q8_0 (a type llama.cpp does not repack on x86, so its vec_dot order
    # is the reference): exercises the Q/K/V biases, NeoX RoPE, the tied output projection and the qwen2
    # pre-tokenizer.
    "qwen2-small": Preset("qwen2-small", 256, 6, 4, 2, 1024, 49152, 1000000.0, 1e-6, 2048,
                          QT.Q8_0, QT.Q8_0, _uniform_q8_0, file_type=7, arch="qwen2"),
    # One quantized type in every matrix (token_embd and output Q8_0, which llama.cpp does not repack on x86):
    # isolates one type's kernels when a mixed model disagrees with llama.cpp.
    **{f"{qt.name.lower()}-small": Preset(f"{qt.name.lower()}-small", 256, 6, 4, 2, 1024, 49152, 10000.0, 1e-5, 2048,
                                          QT.Q8_0, QT.Q8_0, (lambda qt: lambda layer, k: qt)(qt), file_type=7)
       for qt in (QT.Q4_0, QT.Q4_K, QT.Q6_K)},
    # Every matrix Q4_0, token_embd Q8_0 and tied to the output, 128 wide (a 10 MB committed file): llama.cpp
    # repacks all of its matrices on x86, so its default configuration runs the repacked Q4_0 order throughout
    # (the engine's MatmulOrder::kRepacked is tested against it).
    "q4_0-tied-small": Preset("q4_0-tied-small", 128, 6, 4, 2, 512, 49152, 10000.0, 1e-5, 2048,
                              QT.Q8_0, QT.Q8_0, _uniform_q4_0, file_type=2, tied=True),
    # Every layer matrix Q4_K (256 wide: Q4_K's super-blocks are 256 values), token_embd Q8_0 tied to the output:
    # llama.cpp on x86 repacks every layer matrix into q4_K_8x8 (all have a multiple of 8 rows).
    "q4_k-tied-small": Preset("q4_k-tied-small", 256, 6, 4, 2, 1024, 49152, 10000.0, 1e-5, 2048,
                              QT.Q8_0, QT.Q8_0, lambda layer, k: QT.Q4_K, file_type=14, tied=True),
    # The shapes the CUDA figures are measured on (issue 18): SmolLM2-135M's and an 8B llama's with a 49k
    # vocabulary, every matrix Q4_0 (the output Q6_K as llama.cpp's Q4_0 files have it; Q8_0 at width 576,
    # which is not a multiple of Q6_K's 256-value blocks).
    "smollm2-q4_0": Preset("smollm2-q4_0", 576, 30, 9, 3, 1536, 49152, 100000.0, 1e-5, 8192,
                           QT.Q4_0, QT.Q8_0, _uniform_q4_0),
    # SmolLM2-135M-Instruct.Q4_1.gguf's tensor types and shapes: every matrix Q4_1, token_embd Q8_0 and
    # tied to the output, F32 norms: the default model's kernels, for a machine without the file.
    "smollm2-q4_1": Preset("smollm2-q4_1", 576, 30, 9, 3, 1536, 49152, 100000.0, 1e-5, 8192,
                           QT.Q8_0, QT.Q8_0, lambda layer, k: QT.Q4_1, file_type=3, tied=True),
    # The small quants of llama.cpp's Q2_K/Q3_K_*/IQ4_* files: matrix k of layer L has type
    # [Q2_K, Q3_K, IQ4_NL, IQ4_XS][(L + k) % 4] (mixed-small's rotation); token_embd Q8_0, tied to the output.
    "lowbit-small": Preset("lowbit-small", 256, 6, 4, 2, 1024, 49152, 10000.0, 1e-5, 2048,
                           QT.Q8_0, QT.Q8_0, lambda layer, k: kLowBitCycle[(layer + k) % 4], file_type=30, tied=True),
    # Llama 3.1/3.2 layout: RoPE base 500000 with rope_freqs.weight (per-pair frequency divisors), all Q8_0.
    "llama3-small": Preset("llama3-small", 128, 6, 4, 2, 512, 49152, 500000.0, 1e-5, 2048,
                           QT.Q8_0, QT.Q8_0, _uniform_q8_0, file_type=7, tied=True, llama3_rope=True),
    # Qwen3 layout: Q/K RMSNorm per head, heads of 128 (Q is 512 wide on a 128-wide model), all Q8_0; 128
    # wide to keep the committed file small (11 MB).
    "qwen3-small": Preset("qwen3-small", 128, 6, 4, 2, 512, 49152, 1000000.0, 1e-6, 2048,
                          QT.Q8_0, QT.Q8_0, _uniform_q8_0, file_type=7, arch="qwen3", head_dim=128),
    # Phi-3 layout: fused attn_qkv and gate/up (ffn_up of 2 * n_ff rows), Q scaled before the product, NeoX
    # RoPE; 4 heads / 2 KV heads of 32, all Q8_0, tied output.
    "phi3-small": Preset("phi3-small", 128, 6, 4, 2, 512, 49152, 10000.0, 1e-5, 2048,
                         QT.Q8_0, QT.Q8_0, _uniform_q8_0, file_type=7, arch="phi3", tied=True),
    # Gemma 3 layout with a 128-position sliding window, so a 512-token context crosses it: five local
    # layers (RoPE base 10000) and one global, GeGLU, post norms, Q/K norms, one KV head of 128.
    "gemma3-small": Preset("gemma3-small", 128, 6, 4, 1, 512, 49152, 1000000.0, 1e-6, 2048,
                           QT.Q8_0, QT.Q8_0, _uniform_q8_0, file_type=7, arch="gemma3", head_dim=128, swa=128),
    "8b-q4_0": Preset("8b-q4_0", 4096, 32, 32, 8, 14336, 49152, 500000.0, 1e-5, 8192,
                      QT.Q4_0, QT.Q6_K, _uniform_q4_0),
    "llama3-8b-q4_0": Preset("llama3-8b-q4_0", 4096, 32, 32, 8, 14336, 128256, 500000.0, 1e-5, 8192,
                             QT.Q4_0, QT.Q6_K, _uniform_q4_0),
}


# ---- Random codes -----------------------------------------------------------------------------

def _code_table(values: np.ndarray, sigma: float) -> tuple[np.ndarray, float, float]:
    """Inverse-CDF table mapping a uniform uint16 to an index into `values` (discretized normal by value).

    Returns (table, mean, std) of the value distribution the table realizes (exact, from the table counts)."""
    p = np.exp(-0.5 * (values / sigma) ** 2)
    cdf = np.cumsum(p) / p.sum()
    u = (np.arange(65536, dtype=np.float64) + 0.5) / 65536.0
    table = np.searchsorted(cdf, u, side="right").clip(0, len(values) - 1).astype(np.uint8)
    realized = values[table]
    return table, float(realized.mean()), float(realized.std())


# code index -> stored code; values = code - offset
_Q4_0_TABLE, _, _Q4_0_STD = _code_table(np.arange(16) - 8.0, 2.7)
_Q4_K_TABLE, _, _Q4_K_STD = _code_table(np.arange(16) - 7.5, 2.7)
_Q6_K_TABLE, _, _Q6_K_STD = _code_table(np.arange(64) - 32.0, 10.0)
_Q8_0_TABLE, _, _Q8_0_STD = _code_table(np.arange(255) - 127.0, 40.0)  # stored int8 = index - 127


def _codes(rng: np.random.Generator, table: np.ndarray, shape) -> np.ndarray:
    return table[rng.integers(0, 65536, size=shape, dtype=np.uint16)]


def _jitter(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.uniform(0.8, 1.2, size=n)


kJitterRms = float(np.sqrt(1.0 + 0.4 ** 2 / 12.0))


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype("<f2").view(np.uint8).reshape(-1, 2)


# ---- Block writers (layouts identical to ggml) ---------------------------------------------------

def make_q4_0(rng, rows: int, cols: int, std: float) -> np.ndarray:
    nb = rows * cols // kQK
    c = _codes(rng, _Q4_0_TABLE, (nb, kQK))
    qs = c[:, :16] | (c[:, 16:] << 4)  # element j: low nibble of qs[j]; element j+16: high nibble
    sign = np.where(rng.integers(0, 2, size=nb) == 0, -1.0, 1.0)
    d = sign * _jitter(rng, nb) * (std / (_Q4_0_STD * kJitterRms))
    out = np.empty((nb, 18), np.uint8)
    out[:, 0:2] = _f16_bytes(d)
    out[:, 2:] = qs
    return out.reshape(rows, -1)


def make_q4_1(rng, rows: int, cols: int, std: float) -> np.ndarray:
    nb = rows * cols // kQK
    c = _codes(rng, _Q4_0_TABLE, (nb, kQK))  # codes 0..15; value d * code + m with m = -8 d: centred
    qs = c[:, :16] | (c[:, 16:] << 4)
    sign = np.where(rng.integers(0, 2, size=nb) == 0, -1.0, 1.0)
    d = sign * _jitter(rng, nb) * (std / (_Q4_0_STD * kJitterRms))
    out = np.empty((nb, 20), np.uint8)
    out[:, 0:2] = _f16_bytes(d)
    out[:, 2:4] = _f16_bytes(-8.0 * d)
    out[:, 4:] = qs
    return out.reshape(rows, -1)


def make_q8_0(rng, rows: int, cols: int, std: float) -> np.ndarray:
    nb = rows * cols // kQK
    q = (_codes(rng, _Q8_0_TABLE, (nb, kQK)).astype(np.int16) - 127).astype(np.int8)
    d = _jitter(rng, nb) * (std / (_Q8_0_STD * kJitterRms))
    out = np.empty((nb, 34), np.uint8)
    out[:, 0:2] = _f16_bytes(d)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(rows, -1)


def make_q4_k(rng, rows: int, cols: int, std: float) -> np.ndarray:
    nb = rows * cols // kQK_K
    c = _codes(rng, _Q4_K_TABLE, (nb, 4, 2, 32))  # [64-element group, low/high nibble, l]
    qs = (c[:, :, 0, :] | (c[:, :, 1, :] << 4)).reshape(nb, 128)
    sc = rng.integers(40, 64, size=(nb, 8)).astype(np.uint8)  # 6-bit sub-block scales
    mn = sc.copy()  # mins == scales and dmin == 7.5 d: each sub-block is d*sc*(q - 7.5)
    scales = np.empty((nb, 12), np.uint8)
    scales[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0xF) | ((mn[:, 4:8] & 0xF) << 4)
    sc_rms = float(np.sqrt(np.mean(np.arange(40, 64, dtype=np.float64) ** 2)))
    d = _jitter(rng, nb) * (std / (_Q4_K_STD * sc_rms * kJitterRms))
    out = np.empty((nb, 144), np.uint8)
    out[:, 0:2] = _f16_bytes(d)
    out[:, 2:4] = _f16_bytes(7.5 * d)
    out[:, 4:16] = scales
    out[:, 16:] = qs
    return out.reshape(rows, -1)


def make_q6_k(rng, rows: int, cols: int, std: float) -> np.ndarray:
    nb = rows * cols // kQK_K
    # element 128*h + 32*k + l has code c[:, h, k, l]; its low 4 bits go to ql, high 2 bits to qh
    c = _codes(rng, _Q6_K_TABLE, (nb, 2, 4, 32))
    lo, hi = c & 0xF, c >> 4
    ql = np.empty((nb, 2, 64), np.uint8)
    ql[:, :, 0:32] = lo[:, :, 0, :] | (lo[:, :, 2, :] << 4)
    ql[:, :, 32:64] = lo[:, :, 1, :] | (lo[:, :, 3, :] << 4)
    qh = hi[:, :, 0, :] | (hi[:, :, 1, :] << 2) | (hi[:, :, 2, :] << 4) | (hi[:, :, 3, :] << 6)
    mag = rng.integers(64, 128, size=(nb, 16))
    sgn = np.where(rng.integers(0, 2, size=(nb, 16)) == 0, -1, 1)
    scales = (mag * sgn).astype(np.int8)
    sc_rms = float(np.sqrt(np.mean(np.arange(64, 128, dtype=np.float64) ** 2)))
    d = _jitter(rng, nb) * (std / (_Q6_K_STD * sc_rms * kJitterRms))
    out = np.empty((nb, 210), np.uint8)
    out[:, 0:128] = ql.reshape(nb, 128)
    out[:, 128:192] = qh.reshape(nb, 64)
    out[:, 192:208] = scales.view(np.uint8)
    out[:, 208:210] = _f16_bytes(d)
    return out.reshape(rows, -1)


def _signed_scales(rng, shape, lo: int, hi: int) -> np.ndarray:
    """Integer scales with random sign and magnitude in [lo, hi]."""
    mag = rng.integers(lo, hi + 1, size=shape)
    return mag * np.where(rng.integers(0, 2, size=shape) == 0, -1, 1)


def _pack_q2(codes: np.ndarray) -> np.ndarray:
    """(nb, 256) codes of 0..3 -> (nb, 64) bytes: element 128c + 32j + l is bits 2j..2j+1 of byte 32c + l."""
    c = codes.reshape(-1, 2, 4, 32).astype(np.uint8)
    return (c[:, :, 0] | (c[:, :, 1] << 2) | (c[:, :, 2] << 4) | (c[:, :, 3] << 6)).reshape(-1, 64)


def make_q2_k(rng, rows: int, cols: int, std: float) -> np.ndarray:
    nb = rows * cols // kQK_K
    codes = rng.integers(0, 4, size=(nb, kQK_K))
    sc = rng.integers(8, 16, size=(nb, 16)).astype(np.uint8)  # 4-bit group scales; mins equal, dmin = 1.5 d:
    scales = sc | (sc << 4)                                  # each group is d*sc*(q - 1.5), centred
    sc_rms = float(np.sqrt(np.mean(np.arange(8, 16, dtype=np.float64) ** 2)))
    d = _jitter(rng, nb) * (std / (np.sqrt(1.25) * sc_rms * kJitterRms))
    out = np.empty((nb, 84), np.uint8)
    out[:, 0:16] = scales
    out[:, 16:80] = _pack_q2(codes)
    out[:, 80:82] = _f16_bytes(d)
    out[:, 82:84] = _f16_bytes(1.5 * d)
    return out.reshape(rows, -1)


def _pack_k_scales6(s6: np.ndarray) -> np.ndarray:
    """(nb, 16) 6-bit values -> Q3_K's 12 scale bytes (ggml's layout: low nibbles in bytes 0..7, high 2 bits in 8..11)."""
    s6 = s6.astype(np.uint8)
    out = np.empty((s6.shape[0], 12), np.uint8)
    out[:, 0:8] = (s6[:, 0:8] & 0xF) | ((s6[:, 8:16] & 0xF) << 4)
    hi = s6 >> 4
    out[:, 8:12] = hi[:, 0:4] | (hi[:, 4:8] << 2) | (hi[:, 8:12] << 4) | (hi[:, 12:16] << 6)
    return out


def make_q3_k(rng, rows: int, cols: int, std: float) -> np.ndarray:
    nb = rows * cols // kQK_K
    codes = rng.integers(-4, 4, size=(nb, kQK_K))  # value d * (s - 32) * code
    low = (codes & 3).astype(np.uint8)
    high = (codes >= 0).astype(np.uint8)  # the hmask bit is set where code = low bits (no -4)
    hm = high.reshape(nb, 2, 4, 32)
    hmask = np.zeros((nb, 32), np.uint8)
    for c in range(2):
        for j in range(4):
            hmask |= hm[:, c, j, :] << (4 * c + j)
    scales = _signed_scales(rng, (nb, 16), 16, 31) + 32
    code_rms = float(np.sqrt(np.mean(np.arange(-4, 4, dtype=np.float64) ** 2)))
    sc_rms = float(np.sqrt(np.mean(np.arange(16, 32, dtype=np.float64) ** 2)))
    d = _jitter(rng, nb) * (std / (code_rms * sc_rms * kJitterRms))
    out = np.empty((nb, 110), np.uint8)
    out[:, 0:32] = hmask
    out[:, 32:96] = _pack_q2(low)
    out[:, 96:108] = _pack_k_scales6(scales)
    out[:, 108:110] = _f16_bytes(d)
    return out.reshape(rows, -1)


kIq4nlValues = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float64)
kIq4nlRms = float(np.sqrt(np.mean(kIq4nlValues ** 2)))


def _pack_nibbles32(codes: np.ndarray) -> np.ndarray:
    """(n, 32) codes -> (n, 16) bytes: element j in the low nibble of byte j, element j + 16 in its high nibble."""
    c = codes.astype(np.uint8)
    return c[:, :16] | (c[:, 16:] << 4)


def make_iq4_nl(rng, rows: int, cols: int, std: float) -> np.ndarray:
    nb = rows * cols // kQK
    codes = rng.integers(0, 16, size=(nb, kQK))
    sign = np.where(rng.integers(0, 2, size=nb) == 0, -1.0, 1.0)  # the table leans negative; random signs even it out
    d = sign * _jitter(rng, nb) * (std / (kIq4nlRms * kJitterRms))
    out = np.empty((nb, 18), np.uint8)
    out[:, 0:2] = _f16_bytes(d)
    out[:, 2:] = _pack_nibbles32(codes)
    return out.reshape(rows, -1)


def make_iq4_xs(rng, rows: int, cols: int, std: float) -> np.ndarray:
    nb = rows * cols // kQK_K
    codes = rng.integers(0, 16, size=(nb * 8, kQK))
    ls = (_signed_scales(rng, (nb, 8), 16, 31) + 32).astype(np.uint16)  # 6-bit, stored + 32
    scales_h = np.zeros(nb, np.uint16)
    for s in range(8):
        scales_h |= (ls[:, s] >> 4) << (2 * s)
    low = (ls & 0xF).astype(np.uint8)
    sc_rms = float(np.sqrt(np.mean(np.arange(16, 32, dtype=np.float64) ** 2)))
    d = _jitter(rng, nb) * (std / (kIq4nlRms * sc_rms * kJitterRms))
    out = np.empty((nb, 136), np.uint8)
    out[:, 0:2] = _f16_bytes(d)
    out[:, 2:4] = scales_h.astype("<u2").view(np.uint8).reshape(nb, 2)
    out[:, 4:8] = low[:, 0::2] | (low[:, 1::2] << 4)
    out[:, 8:] = _pack_nibbles32(codes).reshape(nb, 128)
    return out.reshape(rows, -1)


def make_f16(rng, rows: int, cols: int, std: float) -> np.ndarray:
    return (std * rng.standard_normal((rows, cols))).astype("<f2").view(np.uint8).reshape(rows, cols * 2)


MAKERS = {QT.F16: make_f16, QT.Q4_0: make_q4_0, QT.Q4_1: make_q4_1, QT.Q8_0: make_q8_0, QT.Q4_K: make_q4_k, QT.Q6_K: make_q6_k,
          QT.Q2_K: make_q2_k, QT.Q3_K: make_q3_k, QT.IQ4_NL: make_iq4_nl, QT.IQ4_XS: make_iq4_xs}


def make_weight(rng, qtype: QT, rows: int, cols: int, std: float) -> np.ndarray:
    """A (rows, row_bytes) uint8 array: `rows` rows of `cols` elements (cols = fan_in = ggml's ne0)."""
    block = kQK_K if qtype in (QT.Q4_K, QT.Q6_K, QT.Q2_K, QT.Q3_K, QT.IQ4_XS) else kQK
    if cols % block:
        raise ValueError(f"{qtype.name} rows need a multiple of {block} elements, got {cols}")
    # One tensor can be big (Llama-3 token_embd: 525M elements); generate it in row chunks to bound memory.
    chunk = max(1, (1 << 24) // cols)
    parts = [MAKERS[qtype](rng, min(chunk, rows - r), cols, std) for r in range(0, rows, chunk)]
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


# ---- Model ----------------------------------------------------------------------------------

def tensor_plan(p: Preset):
    """[(name, qtype, rows, cols, std)] in file order; cols is the fan-in (ne0)."""
    head_dim = p.head_dim or p.n_embd // p.n_head
    kv = head_dim * p.n_head_kv
    q = head_dim * p.n_head
    # A tied table is also the output projection: scaled like one, so the logits have a sane spread.
    tied = p.tied or p.arch in ("qwen2", "qwen3", "gemma3")
    embd_std = kLogitScale / np.sqrt(p.n_embd) if tied else 1.0
    plan = [("token_embd.weight", p.token_embd_type, p.n_vocab, p.n_embd, embd_std),
            ("output_norm.weight", QT.F32, 1, p.n_embd, None)]
    if p.llama3_rope:
        plan.append(("rope_freqs.weight", QT.F32, 1, head_dim // 2, None))
    if not tied:  # qwen2-small ties the output projection to token_embd, as Qwen2-0.5B does (and SmolLM2)
        plan.append(("output.weight", p.output_type, p.n_vocab, p.n_embd, kLogitScale / np.sqrt(p.n_embd)))
    shapes = {"attn_q": (q, p.n_embd), "attn_k": (kv, p.n_embd), "attn_v": (kv, p.n_embd),
              "attn_output": (p.n_embd, q), "ffn_gate": (p.n_ff, p.n_embd),
              "ffn_up": (p.n_ff, p.n_embd), "ffn_down": (p.n_embd, p.n_ff)}
    for layer in range(p.n_layer):
        plan.append((f"blk.{layer}.attn_norm.weight", QT.F32, 1, p.n_embd, None))
        for k, kind in enumerate(kMatrixKinds):
            rows, cols = shapes[kind]
            if p.arch == "phi3":
                # Phi-3's fused matrices: attn_qkv (Q's rows, then K's, then V's) and ffn_up (gate's rows, then up's).
                if kind in ("attn_k", "attn_v", "ffn_gate"):
                    continue
                if kind == "attn_q":
                    kind, rows = "attn_qkv", q + 2 * kv
                if kind == "ffn_up":
                    rows = 2 * p.n_ff
            plan.append((f"blk.{layer}.{kind}.weight", p.layer_types(layer, k), rows, cols, 1.0 / np.sqrt(cols)))
            if p.arch == "qwen2" and kind in ("attn_q", "attn_k", "attn_v"):
                plan.append((f"blk.{layer}.{kind}.bias", QT.F32, 1, rows, 0.1))
            if kind == "attn_v" and p.arch in ("qwen3", "gemma3"):
                plan.append((f"blk.{layer}.attn_q_norm.weight", QT.F32, 1, head_dim, None))
                plan.append((f"blk.{layer}.attn_k_norm.weight", QT.F32, 1, head_dim, None))
            if kind == "attn_output":
                if p.arch == "gemma3":
                    plan.append((f"blk.{layer}.post_attention_norm.weight", QT.F32, 1, p.n_embd, None))
                plan.append((f"blk.{layer}.ffn_norm.weight", QT.F32, 1, p.n_embd, None))
            if kind == "ffn_down" and p.arch == "gemma3":
                plan.append((f"blk.{layer}.post_ffw_norm.weight", QT.F32, 1, p.n_embd, None))
    return plan


def llama3_rope_factors(base: float, dim: int, factor: float = 8.0, low: float = 1.0, high: float = 4.0,
                        old_context: int = 8192) -> np.ndarray:
    """rope_freqs.weight as convert_hf_to_gguf.py writes it for rope_type "llama3"."""
    out = []
    for freq in 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim)):
        wavelen = 2 * np.pi / freq
        if wavelen < old_context / high:
            out.append(1.0)
        elif wavelen > old_context / low:
            out.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def padded_tokenizer(n_vocab: int) -> common.Tokenizer:
    # SmolLM2's vocabulary, from the default model, or from any GGUF that carries it
    # (INFERD_TOKENIZER_GGUF: e.g. tests/data/models/mixed-small.gguf, written by this script).
    source = os.environ.get("INFERD_TOKENIZER_GGUF") or common.SMOLLM2_PATH
    tok = common.load_tokenizer(source, n_vocab=min(n_vocab, 49152))
    while len(tok.tokens) < n_vocab:  # unused ids for larger vocabularies (llama3-8b preset)
        tok.tokens.append(f"[PAD{len(tok.tokens)}]".encode())
        tok.token_types.append(int(gguf.TokenType.UNUSED))
    return tok


def write_model(p: Preset, out_path: str, seed: int, verbose: bool = True) -> None:
    rng = np.random.Generator(np.random.PCG64(seed))
    tok = padded_tokenizer(p.n_vocab)
    if p.arch == "qwen2":
        tok.pre = "qwen2"
    w = gguf.GGUFWriter(out_path, p.arch)
    w.add_type(gguf.GGUFType.MODEL)
    # llama.cpp sets Phi-3's special-token attributes by model name ("phi3" / "phi-3" in general.name), looking
    # up tokens (</s>, <unk>, <s>) that this vocabulary does not have: keep the name clear of it.
    w.add_name(f"inferd synthetic {p.name.replace('phi3', 'phi')} seed {seed}")
    w.add_context_length(p.n_ctx)
    w.add_embedding_length(p.n_embd)
    w.add_block_count(p.n_layer)
    w.add_feed_forward_length(p.n_ff)
    w.add_head_count(p.n_head)
    w.add_head_count_kv(p.n_head_kv)
    w.add_rope_freq_base(p.rope_base)
    w.add_layer_norm_rms_eps(p.rms_eps)
    head_dim = p.head_dim or p.n_embd // p.n_head
    w.add_rope_dimension_count(head_dim)
    if p.head_dim:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if p.swa:
        w.add_sliding_window(p.swa)
    w.add_vocab_size(p.n_vocab)
    w.add_file_type(p.file_type)
    w.add_quantization_version(2)
    w.add_tokenizer_model(tok.model)
    w.add_tokenizer_pre(tok.pre)
    w.add_token_list(tok.tokens)
    w.add_token_types(tok.token_types)
    w.add_token_merges(tok.merges)
    w.add_bos_token_id(tok.bos_id)
    w.add_eos_token_id(tok.eos_id)
    if tok.unk_id is not None:
        w.add_unk_token_id(tok.unk_id)
    if tok.pad_id is not None:
        w.add_pad_token_id(tok.pad_id)
    w.add_add_bos_token(tok.add_bos)
    if tok.add_space_prefix is not None:
        w.add_add_space_prefix(tok.add_space_prefix)
    if tok.chat_template is not None:
        w.add_chat_template(tok.chat_template)

    plan = tensor_plan(p)
    for name, qtype, rows, cols, std in plan:
        if qtype == QT.F32:
            w.add_tensor_info(name, [cols], np.dtype(np.float32), cols * 4)
        else:
            row_bytes = (cols // gguf.GGML_QUANT_SIZES[qtype][0]) * gguf.GGML_QUANT_SIZES[qtype][1]
            w.add_tensor_info(name, [rows, row_bytes], np.dtype(np.uint8), rows * row_bytes, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    # Tensor data is streamed in plan order, so even the 8B preset needs only one tensor in memory at a time.
    for name, qtype, rows, cols, std in plan:
        if name == "rope_freqs.weight":
            data = llama3_rope_factors(p.rope_base, cols * 2)
        elif qtype == QT.F32 and name.endswith(".bias"):
            data = (std * rng.standard_normal(cols)).astype(np.float32)
        elif qtype == QT.F32:
            data = (1.0 + 0.1 * rng.standard_normal(cols)).astype(np.float32)
        else:
            data = make_weight(rng, qtype, rows, cols, std)
        w.write_tensor_data(data)
        if verbose and not name.startswith("blk.") or name.startswith("blk.0."):
            print(f"  {name:28s} {qtype.name:5s} {cols}x{rows}", file=sys.stderr)
    w.close()


def print_types(p: Preset) -> None:
    for name, qtype, rows, cols, std in tensor_plan(p):
        print(f"{name:28s} {qtype.name:5s} ne=[{cols}, {rows}]" if rows > 1 else f"{name:28s} {qtype.name:5s} ne=[{cols}]")


def check(path: str) -> None:
    """Dequantizes every tensor and prints std and mean, to confirm the intended scales."""
    r = gguf.GGUFReader(path)
    for t in r.tensors:
        data = t.data
        if t.tensor_type != QT.F32:
            data = gguf.quants.dequantize(np.asarray(data), t.tensor_type)
        data = np.asarray(data, dtype=np.float64)
        fan_in = int(t.shape[0])
        print(f"{t.name:28s} {t.tensor_type.name:5s} std {data.std():.5f} (x sqrt(fan_in) {data.std() * np.sqrt(fan_in):.3f})"
              f" mean {data.mean():+.5f} finite {bool(np.isfinite(data).all())}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS))
    ap.add_argument("--out")
    ap.add_argument("--seed", type=int, default=kDefaultSeed)
    ap.add_argument("--print-types", action="store_true")
    ap.add_argument("--check", metavar="FILE")
    args = ap.parse_args()
    if args.check:
        check(args.check)
        return 0
    if not args.preset:
        ap.error("--preset is required")
    p = PRESETS[args.preset]
    if args.print_types:
        print_types(p)
        return 0
    if not args.out:
        ap.error("--out is required")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_model(p, args.out, args.seed)
    print(f"{args.out}: {os.path.getsize(args.out)} bytes sha256 {common.sha256_file(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
