// AVX-512 VNNI GEMMs of MatmulOrder::kRepacked (inferd/kernels/cpu.h): Q4_0 and Q4_K in llama.cpp's repacked
// orders and Q6_K in its tiled K-quant GEMM's, for CPUs with AVX-512 F/BW/VL/DQ and VNNI. Equal bit for bit to the
// AVX2 ones (gemm_avx2.cpp, gemm_avx2_k.cpp) and to the definitions (gemm.cpp); only the integer work differs.
//
// Rows in lanes, as the AVX2 tiles, but 16 weight rows per register: lane r of codes[i] holds row r's codes of
// elements 4i..4i+3 (0..15, unsigned), and one vpdpbusd with an activation dword broadcast adds that dword's four
// exact products to each row's int32 sum (no int16 stage, nothing can saturate). Per 32 elements, 16 rows and one
// activation row: 8 vpdpbusd, against 8 maddubs + 8 adds + a madd for 8 rows on AVX2.
//  - Q4_0: per block n = sum code * a - 8 * sum a (the start value), acc = fma(float(n), d_w * d_a, acc).
//  - Q4_K: per sub-block s the row's isum_s, times its scale (vpmulld), into n; the min term by vpmaddwd of the
//    int16 mins with the activation's sub-block sums; the float steps per pair of sub-blocks for the first
//    m - m % 4 activation rows (llama.cpp's GEMM), per super-block for the rest (its GEMV).
//  - Q6_K (from kTiledMinRows activation rows on): per 16-element group the rows' sums of codes (+32) times the
//    activations, times the group scale (vpmulld), into n; the +32 as a vpmaddwd of the scale pairs with the
//    activation's group sums; per super-block y = fma(float(n - 32 * that) * d_w, d_a, y).
// GCC 12's 512-bit intrinsics pass _mm512_undefined_*() as the unused merge source, which its own
// -Wuninitialized flags once inlined (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "gemm_internal.h"
#include "gemm_tiles.h"
#include "inferd/status.h"
#include "isa_tables.h"
#include "x86_common.h"

namespace inferd::kernels::gemm_avx512 {
namespace {

using gemm_tiles::KPairSums;

using gemm_tiles::broadcast32_x16;
using gemm_tiles::store_rows16;

// Activation rows per pass over a group of 16 rows: gemm_tiles::token_block.
using gemm_tiles::token_block;

// ---- Q4_0 ----------------------------------------------------------------------------------------

// One block column of 16 rows, unpacked. Rows past the matrix are zero.
struct alignas(64) RowGroup16 {
  uint32_t codes[8][16];  // [dword][row]
  float d[16];
};
static_assert(sizeof(RowGroup16) == 576);

void unpack_rows16_q4_0(const GemmArgs& g, int64_t row0, int nr, int64_t nb, RowGroup16* out) {
  const float* half = scalar::fp16_table();
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  gemm_tiles::RowBlocks<BlockQ4_0> rows[16];
  for (int r = 0; r < nr; ++r) rows[r] = gemm_tiles::row_blocks<BlockQ4_0>(g, row0 + r);
  for (int64_t b = 0; b < nb; ++b) {
    RowGroup16& o = out[b];
    for (int h = 0; h < 2; ++h) {
      __m256i y[8];
      for (int j = 0; j < 8; ++j) {
        const int r = 8 * h + j;
        if (r >= nr) {
          y[j] = _mm256_setzero_si256();
          continue;
        }
        // Elements 0..15 are the low nibbles, 16..31 the high ones.
        const __m128i packed = rows[r].qs16(b);
        y[j] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), nibble);
      }
      gemm_tiles::transpose8_into<16>(y, o.codes, 8 * h);
    }
    for (int r = 0; r < 16; ++r) {
      o.d[r] = r < nr ? half[rows[r].d(b)] : 0.0f;
    }
  }
}

// One activation row's block: its 32 quants, -8 times their sum, its scale.
struct alignas(8) ActBlock40 {
  int8_t q[32];
  int32_t start;
  float d;
};
static_assert(sizeof(ActBlock40) == 40);

constexpr int kQ4_0Tokens = 12;

template <int T>
void tile16_q4_0(const RowGroup16* w, int64_t nb, const ActBlock40* act, int64_t act_rows_apart, __m512 out[]) {
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const RowGroup16& wb = w[b];
    __m512i n[T];
    for (int t = 0; t < T; ++t) n[t] = _mm512_set1_epi32(act[t * act_rows_apart + b].start);
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const __m512i codes = _mm512_load_si512(wb.codes[i]);
#pragma GCC unroll 12
      for (int t = 0; t < T; ++t) {
        n[t] = _mm512_dpbusd_epi32(n[t], codes, broadcast32_x16(act[t * act_rows_apart + b].q + 4 * i));
      }
    }
    const __m512 d = _mm512_load_ps(wb.d);
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(n[t]), _mm512_mul_ps(d, _mm512_set1_ps(act[t * act_rows_apart + b].d)), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) out[t] = acc[t];
}

void gemm_q4_0_repacked(const GemmArgs& g) {
  thread_local gemm_tiles::Block32Scratch<ActBlock40, RowGroup16> s;
  const float* half = scalar::fp16_table();
  const bool work = s.prepare(g, DType::kQ4_0, [&](const BlockQ8_0& a, ActBlock40& dst) {
    std::memcpy(dst.q, a.qs, 32);
    int32_t sum = 0;
    for (int j = 0; j < 32; ++j) sum += a.qs[j];
    dst.start = -8 * sum;
    dst.d = half[a.d];
  });
  if (!work) return;
  const int64_t nb = g.k / 32;
  __m512 res[kQ4_0Tokens];
  gemm_tiles::repacked_walk<16>(
      g, token_block(nb * static_cast<int64_t>(sizeof(ActBlock40))), kQ4_0Tokens, false,
      [&](int64_t row0, int nr) { unpack_rows16_q4_0(g, row0, nr, nb, s.group.data()); },
      [&](int64_t t, int nt, bool, int64_t row0, int nr) {
        const ActBlock40* act = s.acts.data() + t * nb;
        gemm_tiles::with_count<kQ4_0Tokens>(nt, [&](auto n) { tile16_q4_0<n>(s.group.data(), nb, act, nb, res); });
        for (int i = 0; i < nt; ++i) store_rows16(g, t + i, row0, nr, res[i]);
      });
}

// ---- Q4_K ----------------------------------------------------------------------------------------

// One super-block of 16 rows, unpacked. Rows past the matrix are zero.
struct alignas(64) RowGroup16K {
  static constexpr int kRows = 16;
  uint32_t codes[8][8][16];  // [sub-block][dword][row]
  int32_t scales[8][16];     // [sub-block][row] (for vpmulld)
  int16_t mins[4][32];       // [pair j]: mn_2j and mn_2j+1 of row r in int16 lanes 2r and 2r + 1
  float d[16];
  float dmin[16];

  void set_scale(int s, int r, int sc) { scales[s][r] = sc; }
};
static_assert(sizeof(RowGroup16K) == 4992);

constexpr int kQ4KTokens = 8;

// out[t] lane r = the order's value for row r of the group and activation row t < T; kPairs: llama.cpp's GEMM
// steps (per pair of sub-blocks), else its GEMV's (per super-block).
template <int T, bool kPairs>
void tile16_q4_k(const RowGroup16K* w, int64_t nb, const BlockQ8_K* const* act, const KPairSums* const* pairs,
                 __m512 out[]) {
  alignas(64) float acc[T][16] = {}, accm[T][16] = {};
  const int8_t* q[T];
  for (int t = 0; t < T; ++t) q[t] = act[t]->qs;
  for (int64_t b = 0; b < nb; ++b) {
    const RowGroup16K& wb = w[b];
    const int64_t base = b * static_cast<int64_t>(sizeof(BlockQ8_K));
    __m512i n[T];
    for (int t = 0; t < T; ++t) n[t] = _mm512_setzero_si512();
    auto finish = [&](int t, int j) {  // kPairs: pair j's steps; else the super-block's
      const int32_t* p = reinterpret_cast<const int32_t*>(pairs[t][b].v);
      __m512i m;
      if (kPairs) {
        m = _mm512_madd_epi16(_mm512_load_si512(wb.mins[j]), broadcast32_x16(p + j));
      } else {
        m = _mm512_madd_epi16(_mm512_load_si512(wb.mins[0]), broadcast32_x16(p));
        for (int jj = 1; jj < 4; ++jj) {
          m = _mm512_add_epi32(m, _mm512_madd_epi16(_mm512_load_si512(wb.mins[jj]), broadcast32_x16(p + jj)));
        }
      }
      const __m512 da = _mm512_set1_ps(act[t][b].d);
      _mm512_store_ps(acc[t], _mm512_fmadd_ps(_mm512_cvtepi32_ps(n[t]), _mm512_mul_ps(_mm512_load_ps(wb.d), da),
                                             _mm512_load_ps(acc[t])));
      _mm512_store_ps(accm[t], _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(_mm512_load_ps(wb.dmin), da),
                                              _mm512_load_ps(accm[t])));
      n[t] = _mm512_setzero_si512();
    };
    for (int s = 0; s < 8; ++s) {
      const int64_t off = base + 32 * s;
      __m512i sum[T];
      for (int t = 0; t < T; ++t) sum[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        const __m512i codes = _mm512_load_si512(wb.codes[s][i]);
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) sum[t] = _mm512_dpbusd_epi32(sum[t], codes, broadcast32_x16(q[t] + off + 4 * i));
      }
      const __m512i sc = _mm512_load_si512(wb.scales[s]);
      for (int t = 0; t < T; ++t) n[t] = _mm512_add_epi32(n[t], _mm512_mullo_epi32(sum[t], sc));
      if (kPairs && s % 2 == 1) {
        for (int t = 0; t < T; ++t) finish(t, s / 2);
      }
    }
    if (!kPairs) {
      for (int t = 0; t < T; ++t) finish(t, 0);
    }
  }
  for (int t = 0; t < T; ++t) out[t] = _mm512_sub_ps(_mm512_load_ps(acc[t]), _mm512_load_ps(accm[t]));
}


void gemm_q4_k_repacked(const GemmArgs& g) {
  thread_local gemm_tiles::RepackedKScratch<RowGroup16K> s;
  if (!s.prepare(g)) return;
  const int64_t nb = g.k / kQK_K;
  auto act_row = [&](int64_t t) { return s.act_row(g, t); };
  __m512 res[kQ4KTokens];
  gemm_tiles::repacked_walk<16>(
      g, token_block(nb * static_cast<int64_t>(sizeof(BlockQ8_K))), kQ4KTokens, true,
      [&](int64_t row0, int nr) { gemm_tiles::unpack_q4_k_rows(g, row0, nr, nb, s.group.data()); },
      [&](int64_t t, int nt, bool gemm_row, int64_t row0, int nr) {
        const BlockQ8_K* acts[kQ4KTokens] = {};
        const KPairSums* tile_pairs[kQ4KTokens] = {};
        for (int i = 0; i < nt; ++i) {
          acts[i] = act_row(t + i);
          tile_pairs[i] = s.pairs.data() + (t + i) * nb;
        }
        if (gemm_row) {
          gemm_tiles::with_count<kQ4KTokens>(nt, [&](auto n) { tile16_q4_k<n, true>(s.group.data(), nb, acts, tile_pairs, res); });
        } else {  // at most 3 rows: the GEMV's
          gemm_tiles::with_count<3>(nt, [&](auto n) { tile16_q4_k<n, false>(s.group.data(), nb, acts, tile_pairs, res); });
        }
        for (int i = 0; i < nt; ++i) store_rows16(g, t + i, row0, nr, res[i]);
      });
}

// ---- Q6_K from kTiledMinRows activation rows on (llama.cpp's tiled K-quant GEMM) ----------------------

// One super-block of 16 rows, unpacked by gemm_tiles::unpack_q6_k_rows: lane r of codes[g][i] holds row r's codes
// (+32, 0..63) of elements 16g + 4i .. + 3; scales[g] its group scales as int32; pairs[j] sc_2j and sc_2j+1 in int16
// lanes 2r, 2r + 1 (the -32 offset's madd with the activation's group sums). Rows past the matrix are zero.
struct alignas(64) RowGroup16Q6 {
  static constexpr int kRows = 16;
  uint32_t codes[16][4][16];
  int32_t scales[16][16];
  int16_t pairs[8][32];
  float d[16];

  void set_scale(int g, int r, int8_t sc) { scales[g][r] = sc; }
};
static_assert(sizeof(RowGroup16Q6) == 5696);


constexpr int kQ6KTokens = 8;

// out[t] lane r = the tiled order's value for row r of the group and activation row t < T.
template <int T>
void tile16_q6_k(const RowGroup16Q6* w, int64_t nb, const BlockQ8_K* const* act, __m512 out[]) {
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const RowGroup16Q6& wb = w[b];
    __m512i n[T];
    for (int t = 0; t < T; ++t) n[t] = _mm512_setzero_si512();
    for (int gg = 0; gg < 16; ++gg) {
      __m512i sum[T];
      for (int t = 0; t < T; ++t) sum[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m512i codes = _mm512_load_si512(wb.codes[gg][i]);
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          sum[t] = _mm512_dpbusd_epi32(sum[t], codes, broadcast32_x16(act[t][b].qs + 16 * gg + 4 * i));
        }
      }
      const __m512i sc = _mm512_load_si512(wb.scales[gg]);
      for (int t = 0; t < T; ++t) n[t] = _mm512_add_epi32(n[t], _mm512_mullo_epi32(sum[t], sc));
    }
    const __m512 d = _mm512_load_ps(wb.d);
    for (int t = 0; t < T; ++t) {
      // The codes' +32: 32 * sum_g sc_g * bsum_g, by pairs of groups.
      __m512i off = _mm512_setzero_si512();
      for (int j = 0; j < 8; ++j) {
        off = _mm512_add_epi32(
            off, _mm512_madd_epi16(_mm512_load_si512(wb.pairs[j]), broadcast32_x16(act[t][b].bsums + 2 * j)));
      }
      const __m512i total = _mm512_sub_epi32(n[t], _mm512_slli_epi32(off, 5));
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(total), d), _mm512_set1_ps(act[t][b].d), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) out[t] = acc[t];
}

// MatmulOrder::kRepacked for Q6_K: the vec_dot order's GEMM below kTiledMinRows activation rows, the tiled order
// from there.
void gemm_q6_k_repacked(const GemmArgs& g) {
  INFERD_ASSERT(g.type == DType::kQ6_K && g.k % kQK_K == 0, "this GEMM is Q6_K's");
  INFERD_ASSERT(g.layout == WeightLayout::kRows || g.r0 % kInterleaveRows == 0, "an interleaved GEMM starts at a group");
  if (g.m < kTiledMinRows) return gemm_avx512_k::kernel(DType::kQ6_K)(g);
  if (g.r1 <= g.r0) return;
  const int64_t nb = g.k / kQK_K;
  thread_local std::vector<RowGroup16Q6> group;
  if (group.size() < static_cast<size_t>(nb)) group.resize(static_cast<size_t>(nb));
  auto act_row = [&](int64_t t) { return reinterpret_cast<const BlockQ8_K*>(g.act + static_cast<size_t>(t) * g.act_stride); };
  __m512 res[kQ6KTokens];
  gemm_tiles::repacked_walk<16>(
      g, token_block(nb * static_cast<int64_t>(sizeof(BlockQ8_K))), kQ6KTokens, false,
      [&](int64_t row0, int nr) { gemm_tiles::unpack_q6_k_rows(g, row0, nr, nb, group.data()); },
      [&](int64_t t, int nt, bool, int64_t row0, int nr) {
        const BlockQ8_K* acts[kQ6KTokens] = {};
        for (int i = 0; i < nt; ++i) acts[i] = act_row(t + i);
        gemm_tiles::with_count<kQ6KTokens>(nt, [&](auto n) { tile16_q6_k<n>(group.data(), nb, acts, res); });
        for (int i = 0; i < nt; ++i) store_rows16(g, t + i, row0, nr, res[i]);
      });
}

}  // namespace

GemmFn repacked_kernel(DType type) {
  switch (type) {
    case DType::kQ4_0:
      return &gemm_q4_0_repacked;
    case DType::kQ4_K:
      return &gemm_q4_k_repacked;
    case DType::kQ6_K:
      return &gemm_q6_k_repacked;
    default:
      return nullptr;
  }
}

}  // namespace inferd::kernels::gemm_avx512
