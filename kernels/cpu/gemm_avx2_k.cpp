// AVX2 GEMM for the 256-element super-block types, Q2_K to Q6_K and IQ4_XS (see inferd/kernels/gemm.h for
// the contract), for CPUs with AVX2, FMA and F16C but no AVX-512; Q2_K, Q3_K and IQ4_XS on AVX-512 CPUs too
// (their dot kernels have the same 8 lanes on both ISAs, so this GEMM equals both bit for bit).
//
// Numerics: every output is bit-identical to the `dot` kernel of its type (x86_kernels.inc: dot_k_min
// for Q4_K/Q5_K, dot_q6_k_nr for Q6_K, the step() of Q2K, Q3K and IQ4XS). One ymm per activation row holds the 8
// float lanes; lane j's integer sum per super-block is the exact sum of maddubs(unsigned codes, signed
// activations) then madd with the int16 scale, as the dot kernel computes it (integers are exact in any
// order), and the float steps per block (k_min_float_step, q6_k_float_step, the steps of Q2K, Q3K, IQ4XS)
// and the final reduction (k_min_result, hsum) are repeated operation for operation.
//
// Layout of the work ("chunk by chunk"): a tile is one weight row and T = 8 activation rows. Per
// super-block, the row's codes of one 32-element chunk and that chunk's int16 scales are decoded into
// registers, and the T activation rows' integer lane sums (one ymm each, in registers) take the chunk
// in turn: per (activation row, chunk) one load of activations and maddubs, madd, add (Q3_K: a second
// maddubs and a subtract, as ggml). Nothing decoded is stored and reloaded. This order measured 5-10%
// faster than a super-block decoded to the stack and walked by 12 activation rows (Q4_K to Q6_K) and
// 1.2-1.4x faster than the dot kernels with 4 activation rows (Q2_K, Q3_K, IQ4_XS), single thread on a
// Zen 3 EPYC. Activation rows are read in place (Q8_K rows at act_stride); the tile walk counts them in pairs
// and an odd last row is simply computed twice.
//
// tiled_kernel(): MatmulOrder::kRepacked's GEMMs from kTiledMinRows activation rows on (llama.cpp's tiled K-quant
// GEMM, the same on AVX2 and AVX-512 CPUs): Q2_K, Q3_K and IQ4_XS as the tiles above with the tiled float step
// (TiledRows), Q5_K and Q6_K with 8 weight rows in lanes (gemm_tiled_lanes, at the end).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "gemm_internal.h"
#include "gemm_tiles.h"
#include "inferd/status.h"
#include "isa_tables.h"
#include "x86_common.h"

namespace inferd::kernels::gemm_avx2_k {
namespace {

// Prefetch distance along the weight rows (as gemm_avx512.cpp).
constexpr int kPrefetchBytes = 4096;

// Asks for the lines of the block of `bytes` at kPrefetchBytes past `block` (its last byte too: a block may
// straddle one more line than bytes / 64).
inline void prefetch_ahead(const void* block, size_t bytes) {
  const char* ahead = static_cast<const char*>(block) + kPrefetchBytes;
  for (size_t off = 0; off < bytes; off += 64) _mm_prefetch(ahead + off, _MM_HINT_T0);
  _mm_prefetch(ahead + bytes - 1, _MM_HINT_T0);
}

// llama.cpp's tiled K-quant GEMM (MatmulOrder::kRepacked from kTiledMinRows activation rows on, gemm.h; scalar.cpp's
// tiled_step) for the T <= 8 activation rows of a tile, held in the lanes of one vector: per super-block the exact
// totals n = sum sc * isum and m = sum mn * bsum of each row (the lane sums of its integer vectors), then
// y = fma(fma(-dmin, float(m), d * float(n)), d_a, y), without a min y = fma(float(n) * d, d_a, y): per lane the
// scalar step's operations, for all rows at once (a horizontal sum and a scalar step per row cost Q5_K's tiled GEMM
// 12% against the vec_dot order's).
template <int T>
struct TiledRows {
  static_assert(T >= 1 && T <= 8, "one vector of rows");
  __m256 y = _mm256_setzero_ps();

  // Lane t: the sum of v[t]'s 8 lanes (t < T; 0 past T). Integer adds, exact in any order.
  static __m256i totals(const __m256i* v) {
    __m256i w[8];
    for (int t = 0; t < 8; ++t) w[t] = t < T ? v[t] : _mm256_setzero_si256();
    // a = [t0..t3 over lanes 0..3 | t0..t3 over lanes 4..7], b the same for t4..t7.
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(w[0], w[1]), _mm256_hadd_epi32(w[2], w[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(w[4], w[5]), _mm256_hadd_epi32(w[6], w[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
  }
  static __m256 act_d(const BlockQ8_K* const* acts, int64_t i) {
    alignas(32) float d[8] = {};
    for (int t = 0; t < T; ++t) d[t] = acts[t][i].d;
    return _mm256_load_ps(d);
  }
  void step(const __m256i* n, float d, const BlockQ8_K* const* acts, int64_t i) {
    const __m256 scaled = _mm256_mul_ps(_mm256_cvtepi32_ps(totals(n)), _mm256_set1_ps(d));
    y = _mm256_fmadd_ps(scaled, act_d(acts, i), y);
  }
  void step(const __m256i* n, const __m256i* m, float d, float dmin, const BlockQ8_K* const* acts, int64_t i) {
    const __m256 dn = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(totals(n)));
    const __m256 res = _mm256_fmadd_ps(_mm256_set1_ps(-dmin), _mm256_cvtepi32_ps(totals(m)), dn);
    y = _mm256_fmadd_ps(res, act_d(acts, i), y);
  }
  void store(float* out) const {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, y);
    for (int t = 0; t < T; ++t) out[t] = lanes[t];
  }
};

// Activation pairs per tile: T = 2 * kRowPairs activation rows' integer sums in registers, beside a
// chunk's codes and scales (3 and 6 pairs measured no better on Q2_K and Q3_K).
constexpr int kRowPairs = 4;

// k_min_pair_sums of one activation block, stored.
struct alignas(16) PairSums {
  int16_t v[8];
};

struct RowIo {
  const GemmArgs* g;
  int64_t row0;
  const BlockQ8_K* const* acts;  // the tile's 2 * P activation rows
  int64_t nb;
  float (*res)[2 * kRowPairs];    // [0][activation row]
  const PairSums* const* pairs;  // Q4_K, Q5_K: per activation row, [block] its sub-block sums
};

// The 8 sub-block sums bsum_2j + bsum_2j+1 of a Q8_K block, as dot_k_min forms them (one horizontal add, which
// costs three operations: the GEMM forms them once per activation row and block, not once per weight row).
inline __m128i k_min_pair_sums(const BlockQ8_K& a) {
  const __m256i bsums = load32(a.bsums);
  return _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
}

// Q2_K (kThree = false) and Q3_K (kThree = true): Q2_K's min term goes first, then the quant sums, as in
// Q2K::step. kTiled: the tiled order's step per super-block (tiled_step) on the same exact integers.
template <bool kThree, int R, int P, bool kTiled = false>
void tile_low_bit(const RowIo& io) {
  static_assert(R == 1, "one weight row per tile");
  using Block = std::conditional_t<kThree, BlockQ3_K, BlockQ2_K>;
  constexpr int T = 2 * P;
  const auto* w = reinterpret_cast<const Block*>(io.g->w + static_cast<size_t>(io.row0) * io.g->w_row_bytes);
  __m256 acc[T];
  [[maybe_unused]] TiledRows<T> tiled;
  [[maybe_unused]] __m256i msum[T];
  [[maybe_unused]] float dmin_w = 0.0f;
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < io.nb; ++i) {
    const Block& b = w[i];
    prefetch_ahead(&b, sizeof(Block));
    __m128i sc8;
    [[maybe_unused]] __m256i hbits;
    if constexpr (kThree) {
      sc8 = unpack_q3_k_scales(b.scales);
      hbits = load32(b.hmask);
    } else {
      // Q2K::step's min term, before the quant sums.
      __m256i mins16;
      q2_k_scales_mins(b, sc8, mins16);
      dmin_w = h2f(b.dmin);
      for (int t = 0; t < T; ++t) {
        const BlockQ8_K& a = io.acts[t][i];
        const __m256i prod = _mm256_madd_epi16(mins16, load32(a.bsums));
        if constexpr (kTiled) {
          msum[t] = prod;
        } else {
          const float dmin = -a.d * dmin_w;
          acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc[t]);
        }
      }
    }
    const ChunkScales scales(sc8);
    __m256i sumi[T];
    for (int t = 0; t < T; ++t) sumi[t] = _mm256_setzero_si256();
    // Unrolled: each chunk's shift counts become constants.
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const __m256i low = two_bit_codes(b.qs, c);
      const __m256i s16 = scales(c);
      [[maybe_unused]] __m256i fours;
      if constexpr (kThree) fours = q3_k_fours(hbits, c);
      for (int t = 0; t < T; ++t) {
        const __m256i y = load32(io.acts[t][i].qs + 32 * c);
        __m256i p16 = _mm256_maddubs_epi16(low, y);
        if constexpr (kThree) p16 = _mm256_sub_epi16(p16, _mm256_maddubs_epi16(fours, y));
        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p16, s16));
      }
    }
    const float d = h2f(b.d);
    if constexpr (kTiled && kThree) {
      tiled.step(sumi, d, io.acts, i);
    } else if constexpr (kTiled) {
      tiled.step(sumi, msum, d, dmin_w, io.acts, i);
    } else {
      for (int t = 0; t < T; ++t) {
        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(io.acts[t][i].d * d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
      }
    }
  }
  if constexpr (kTiled) {
    tiled.store(io.res[0]);
  } else {
    for (int t = 0; t < T; ++t) io.res[0][t] = gemm_tiles::reduce8(acc[t]);
  }
}

// Q4_K / Q5_K: a 32-byte quant chunk holds two sub-blocks (low and high nibbles), each with its own scale.
// (Q5_K's tiled order has a GEMM of its own, gemm_tiled_lanes below.)
template <bool kHigh, int R, int P>
void tile_k_min_rows(const RowIo& io) {
  static_assert(R == 1, "one weight row per tile");
  using Block = std::conditional_t<kHigh, BlockQ5_K, BlockQ4_K>;
  constexpr int T = 2 * P;
  const gemm_tiles::KRowBlocks<Block> b = gemm_tiles::k_row_blocks<Block>(*io.g, io.row0);
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  __m256 acc[T];
  __m128 acc_m[T];
  float summs[T];
  for (int t = 0; t < T; ++t) {
    acc[t] = _mm256_setzero_ps();
    acc_m[t] = _mm_setzero_ps();
    summs[t] = 0.0f;
  }
  for (int64_t i = 0; i < io.nb; ++i) {
    prefetch_ahead(b.block(i), sizeof(Block));
    uint32_t sm[4];
    unpack_k4_scales(b.scales(i).v, sm);
    const __m128i sm_bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sm));
    const __m128i mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(sm_bytes, sm_bytes));
    const auto* sc = reinterpret_cast<const uint8_t*>(sm);
    const float d = h2f(b.d(i)), dmin = h2f(b.dmin(i));
    // k_min_float_step's min term (its own accumulator: independent of the quant sums' order).
    for (int t = 0; t < T; ++t) {
      const BlockQ8_K& a = io.acts[t][i];
      const __m128i prod = _mm_madd_epi16(mins, _mm_load_si128(reinterpret_cast<const __m128i*>(io.pairs[t][i].v)));
      const float neg_dmin = -(a.d * dmin);
      if constexpr (kHigh) {
        __m128i s = _mm_add_epi32(prod, _mm_unpackhi_epi64(prod, prod));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
        summs[t] = std::fma(neg_dmin, static_cast<float>(_mm_cvtsi128_si32(s)), summs[t]);
      } else {
        acc_m[t] = _mm_fmadd_ps(_mm_set1_ps(neg_dmin), _mm_cvtepi32_ps(prod), acc_m[t]);
      }
    }
    __m256i sumi[T];
    for (int t = 0; t < T; ++t) sumi[t] = _mm256_setzero_si256();
    [[maybe_unused]] __m256i hbits;
    if constexpr (kHigh) hbits = load32(b.qh(i));
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m256i x = b.chunk(i, c);
      __m256i lo = _mm256_and_si256(x, nibble);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), nibble);
      if constexpr (kHigh) {
        const __m256i one = _mm256_set1_epi8(1);
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * c), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * c + 1), one), 4));
      }
      const __m256i s_lo = _mm256_set1_epi16(sc[2 * c]);
      const __m256i s_hi = _mm256_set1_epi16(sc[2 * c + 1]);
      for (int t = 0; t < T; ++t) {
        const int8_t* y = io.acts[t][i].qs + 64 * c;
        const __m256i n_lo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load32(y)), s_lo);
        const __m256i n_hi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load32(y + 32)), s_hi);
        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(n_lo, n_hi));
      }
    }
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(io.acts[t][i].d * d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
    }
  }
  // k_min_result.
  for (int t = 0; t < T; ++t) {
    if constexpr (kHigh) {
      io.res[0][t] = gemm_tiles::reduce8(acc[t]) + summs[t];
    } else {
      __m128 m = _mm_add_ps(acc_m[t], _mm_movehl_ps(acc_m[t], acc_m[t]));
      m = _mm_add_ss(m, _mm_movehdup_ps(m));
      io.res[0][t] = gemm_tiles::reduce8(acc[t]) + _mm_cvtss_f32(m);
    }
  }
}

// Q6_K chunk by chunk: chunk c = 4 * half + j's codes (+32, 0..63) and its 16 int16 scales in registers.
// (Its tiled order has a GEMM of its own, gemm_q6_k_tiled below.)
template <int R, int P>
void tile_q6_k_rows(const RowIo& io) {
  static_assert(R == 1, "one weight row per tile");
  constexpr int T = 2 * P;
  const gemm_tiles::Q6RowBlocks b = gemm_tiles::q6_row_blocks(*io.g, io.row0);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < io.nb; ++i) {
    prefetch_ahead(b.ql(i, 0), sizeof(BlockQ6_K));
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales(i)));
    const ChunkScales scales(sc8);
    __m256i sumi[T];
    for (int t = 0; t < T; ++t) sumi[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      // q6_k_quants' decoding, chunk by chunk (the unrolled loop loads each half's 96 bytes once).
      const int half = c / 4;
      const __m256i q =
          q6_k_codes(load32(b.ql(i, 2 * half)), load32(b.ql(i, 2 * half + 1)), load32(b.qh(i, half)), c % 4);
      const __m256i s16 = scales(c);
      for (int t = 0; t < T; ++t) {
        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q, load32(io.acts[t][i].qs + 32 * c)), s16));
      }
    }
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    const float d = h2f(b.d(i));
    for (int t = 0; t < T; ++t) {
      const BlockQ8_K& a = io.acts[t][i];
      // q6_k_float_step, operation for operation.
      const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(sc16, load32(a.bsums)), 5);
      const __m256i total = _mm256_sub_epi32(sumi[t], offset);
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * a.d), _mm256_cvtepi32_ps(total), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) io.res[0][t] = gemm_tiles::reduce8(acc[t]);
}

// IQ4_XS: sub-block s's 32 non-linear values and their |x| in registers; per activation row ggml's sign
// trick (mul_add_i8), madd with the sub-block scale, add; then IQ4XS::step's one float step per block (kTiled: the
// tiled order's, tiled_step).
template <int R, int P, bool kTiled = false>
void tile_iq4_xs(const RowIo& io) {
  static_assert(R == 1, "one weight row per tile");
  constexpr int T = 2 * P;
  const auto* w = reinterpret_cast<const BlockIQ4_XS*>(io.g->w + static_cast<size_t>(io.row0) * io.g->w_row_bytes);
  __m256 acc[T];
  [[maybe_unused]] TiledRows<T> tiled;
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < io.nb; ++i) {
    const BlockIQ4_XS& b = w[i];
    prefetch_ahead(&b, sizeof(BlockIQ4_XS));
    __m256i sumi[T];
    for (int t = 0; t < T; ++t) sumi[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) {
      const __m256i v = iq4_values(b.qs + 16 * s);
      const __m256i abs_v = _mm256_sign_epi8(v, v);
      const __m256i ls = _mm256_set1_epi16(iq4_xs_scale(b, s));
      for (int t = 0; t < T; ++t) {
        const __m256i y = _mm256_sign_epi8(load32(io.acts[t][i].qs + 32 * s), v);
        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(_mm256_maddubs_epi16(abs_v, y), ls));
      }
    }
    const float d = h2f(b.d);
    if constexpr (kTiled) {
      tiled.step(sumi, d, io.acts, i);
    } else {
      for (int t = 0; t < T; ++t) {
        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * io.acts[t][i].d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
      }
    }
  }
  if constexpr (kTiled) {
    tiled.store(io.res[0]);
  } else {
    for (int t = 0; t < T; ++t) io.res[0][t] = gemm_tiles::reduce8(acc[t]);
  }
}

// The tile of kType for TileTable: the vec_dot order's, or (kTiled) the tiled order's.
template <DType kType, bool kTiled = false>
struct RowTile {
  template <int R, int P>
  static void fn(const RowIo& io) {
    if constexpr (kType == DType::kQ2_K || kType == DType::kQ3_K) {
      tile_low_bit<kType == DType::kQ3_K, R, P, kTiled>(io);
    } else if constexpr (kType == DType::kIQ4_XS) {
      tile_iq4_xs<R, P, kTiled>(io);
    } else if constexpr (kType == DType::kQ4_K || kType == DType::kQ5_K) {
      static_assert(!kTiled, "Q5_K's tiled order is gemm_tiled_lanes'");
      tile_k_min_rows<kType == DType::kQ5_K, R, P>(io);
    } else {
      static_assert(!kTiled, "Q6_K's tiled order is gemm_q6_k_tiled's");
      tile_q6_k_rows<R, P>(io);
    }
  }
};

template <DType kType, typename Tile = RowTile<kType>>
void gemm_rows(const GemmArgs& g) {
  INFERD_ASSERT(g.k % kQK_K == 0, "k must be a multiple of 256");
  INFERD_ASSERT(g.layout == WeightLayout::kRows || (interleavable(kType) && g.r0 % kInterleaveRows == 0),
                "an interleaved GEMM starts at a group");
  if (g.m <= 0 || g.r1 <= g.r0) return;
  const int64_t nb = g.k / kQK_K;
  const int64_t npairs = (g.m + 1) / 2;
  constexpr bool kMinPairs = kType == DType::kQ4_K || kType == DType::kQ5_K;
  thread_local std::vector<PairSums> pairs;
  if constexpr (kMinPairs) {
    pairs.resize(static_cast<size_t>(g.m * nb));
    for (int64_t t = 0; t < g.m; ++t) {
      const auto* a = reinterpret_cast<const BlockQ8_K*>(g.act + static_cast<size_t>(t) * g.act_stride);
      for (int64_t i = 0; i < nb; ++i) {
        _mm_store_si128(reinterpret_cast<__m128i*>(pairs[static_cast<size_t>(t * nb + i)].v), k_min_pair_sums(a[i]));
      }
    }
  }
  gemm_tiles::RowLayoutView view(g);
  gemm_tiles::walk<1, kRowPairs>(
      g, npairs,
      [&](int64_t r, int nr, int64_t p0, int np, float (*res)[2 * kRowPairs]) {
        const BlockQ8_K* acts[2 * kRowPairs];
        for (int t = 0; t < 2 * np; ++t) {
          const int64_t row = std::min(2 * p0 + t, g.m - 1);  // an odd last row is computed twice
          acts[t] = reinterpret_cast<const BlockQ8_K*>(g.act + static_cast<size_t>(row) * g.act_stride);
        }
        const PairSums* tile_pairs[2 * kRowPairs] = {};
        if constexpr (kMinPairs) {
          for (int t = 0; t < 2 * np; ++t) tile_pairs[t] = pairs.data() + std::min(2 * p0 + t, g.m - 1) * nb;
        }
        gemm_tiles::TileTable<Tile, 1, kRowPairs>::kTable[nr - 1][np - 1](
            RowIo{&view.args(), view.row(r), acts, nb, res, tile_pairs});
      },
      [&](int64_t rc, int64_t rc_end) { view.load(rc, rc_end); });
}

// ---- Q5_K and Q6_K in the tiled order, 8 rows in lanes ----------------------------------------------------
//
// The tiled order sums a super-block exactly before any float step, so the rows can sit in the lanes (as the
// AVX-512 GEMM's, gemm_avx512_repacked.cpp) instead of the vec_dot tile's one row per register: per 16-element
// group and activation row, 4 broadcast activation dwords meet the 8 rows' codes by maddubs (pair sums <= 2 * 63 *
// 127; two of them added in int16 stay below 32768), two madds with the group's scales make int32, two adds: 14
// operations per 8 x 16 products against about 20 in the vec_dot tiles. 6 activation rows share each codes load.

// One super-block of 8 rows, unpacked (Q6_K: gemm_tiles::unpack_q6_k_rows): lane r of codes[g][i] holds row r's
// codes (Q6_K 0..63, Q5_K 0..31) of elements 16g + 4i .. + 3; scales[g] row r's scale of group g (Q5_K: of its
// sub-block g / 2) in int16 lanes 2r and 2r + 1; pairs[j] in int16 lanes 2r, 2r + 1 the weights of the activation's
// group sums bsum_2j and bsum_2j+1 (Q6_K: sc_2j and sc_2j+1, for the codes' +32; Q5_K: mn_j twice, the min term m);
// d and dmin the rows' scales. Rows past the matrix are zero.
struct alignas(32) RowGroup8K {
  static constexpr int kRows = 8;
  uint32_t codes[16][4][8];
  int16_t scales[16][16];
  int16_t pairs[8][16];
  float d[8];
  float dmin[8];  // Q5_K

  void set_scale(int g, int r, int16_t sc) { scales[g][2 * r] = scales[g][2 * r + 1] = sc; }
};
static_assert(sizeof(RowGroup8K) == 2880);

void unpack_rows8_q5_k(const GemmArgs& g, int64_t row0, int nr, int64_t nb, RowGroup8K* out) {
  const float* half = scalar::fp16_table();
  gemm_tiles::KRowBlocks<BlockQ5_K> rows[8];
  for (int r = 0; r < nr; ++r) rows[r] = gemm_tiles::k_row_blocks<BlockQ5_K>(g, row0 + r);
  const __m256i nibble = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  for (int64_t b = 0; b < nb; ++b) {
    RowGroup8K& o = out[b];
    for (int s = 0; s < 8; ++s) {  // sub-block s: groups 2s and 2s + 1 (tile_k_min_rows' decoding)
      __m256i y[8];
      for (int r = 0; r < 8; ++r) {
        if (r >= nr) {
          y[r] = _mm256_setzero_si256();
          continue;
        }
        const __m256i x = rows[r].chunk(b, s / 2);
        const __m256i low4 = s % 2 == 0 ? _mm256_and_si256(x, nibble) : _mm256_and_si256(_mm256_srli_epi16(x, 4), nibble);
        const __m256i fifth = _mm256_and_si256(_mm256_srli_epi16(load32(rows[r].qh(b)), s), one);
        y[r] = _mm256_or_si256(low4, _mm256_slli_epi16(fifth, 4));
      }
      alignas(32) uint32_t t[8][8];
      gemm_tiles::transpose8(y, t);
      for (int i = 0; i < 8; ++i) std::memcpy(o.codes[2 * s + i / 4][i % 4], t[i], sizeof(t[i]));
    }
    for (int r = 0; r < 8; ++r) {
      uint32_t sm[4] = {};
      if (r < nr) unpack_k4_scales(rows[r].scales(b).v, sm);
      const auto* bytes = reinterpret_cast<const uint8_t*>(sm);  // scales 0..7, mins 8..15
      for (int gg = 0; gg < 16; ++gg) o.scales[gg][2 * r] = o.scales[gg][2 * r + 1] = bytes[gg / 2];
      for (int j = 0; j < 8; ++j) o.pairs[j][2 * r] = o.pairs[j][2 * r + 1] = bytes[8 + j];
      o.d[r] = r < nr ? half[rows[r].d(b)] : 0.0f;
      o.dmin[r] = r < nr ? half[rows[r].dmin(b)] : 0.0f;
    }
  }
}

// Activation rows per tile: 6 accumulators beside 4 codes registers, the scales and the temporaries.
constexpr int kQ6KTokens = 6;

// out[t] lane r = the tiled order's value for row r of the group and activation row t < T.
template <DType kType, int T>
void tile8_k(const RowGroup8K* w, int64_t nb, const BlockQ8_K* const* act, __m256 out[]) {
  static_assert(T >= 1 && T <= kQ6KTokens);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const RowGroup8K& wb = w[b];
    __m256i n[T];
    for (int t = 0; t < T; ++t) n[t] = _mm256_setzero_si256();
    for (int gg = 0; gg < 16; ++gg) {
      const __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb.codes[gg][0]));
      const __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb.codes[gg][1]));
      const __m256i c2 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb.codes[gg][2]));
      const __m256i c3 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb.codes[gg][3]));
      const __m256i sc = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb.scales[gg]));
#pragma GCC unroll 6
      for (int t = 0; t < T; ++t) {
        const int8_t* a = act[t][b].qs + 16 * gg;
        const __m256i s01 = _mm256_add_epi16(_mm256_maddubs_epi16(c0, gemm_tiles::broadcast32(a)), _mm256_maddubs_epi16(c1, gemm_tiles::broadcast32(a + 4)));
        const __m256i s23 = _mm256_add_epi16(_mm256_maddubs_epi16(c2, gemm_tiles::broadcast32(a + 8)), _mm256_maddubs_epi16(c3, gemm_tiles::broadcast32(a + 12)));
        n[t] = _mm256_add_epi32(n[t], _mm256_add_epi32(_mm256_madd_epi16(s01, sc), _mm256_madd_epi16(s23, sc)));
      }
    }
    const __m256 d = _mm256_load_ps(wb.d);
    for (int t = 0; t < T; ++t) {
      // Q6_K: the codes' +32, 32 * sum_g sc_g * bsum_g; Q5_K: the min term m = sum_j mn_j * (bsum_2j + bsum_2j+1).
      __m256i p = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {
        p = _mm256_add_epi32(p, _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(wb.pairs[j])),
                                                  gemm_tiles::broadcast32(act[t][b].bsums + 2 * j)));
      }
      const __m256 da = _mm256_set1_ps(act[t][b].d);
      if constexpr (kType == DType::kQ6_K) {
        const __m256i total = _mm256_sub_epi32(n[t], _mm256_slli_epi32(p, 5));
        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(total), d), da, acc[t]);
      } else {
        // fma(fma(-dmin, float(m), d * float(n)), d_a, y), lane by lane (TiledRows::step).
        const __m256 neg_dmin = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_load_ps(wb.dmin));
        const __m256 res = _mm256_fmadd_ps(neg_dmin, _mm256_cvtepi32_ps(p), _mm256_mul_ps(d, _mm256_cvtepi32_ps(n[t])));
        acc[t] = _mm256_fmadd_ps(res, da, acc[t]);
      }
    }
  }
  for (int t = 0; t < T; ++t) out[t] = acc[t];
}

template <DType kType>
void gemm_tiled_lanes(const GemmArgs& g) {
  static_assert(kType == DType::kQ5_K || kType == DType::kQ6_K);
  INFERD_ASSERT(g.type == kType && g.k % kQK_K == 0, "this GEMM is %s's", dtype_name(kType));
  INFERD_ASSERT(g.layout == WeightLayout::kRows || g.r0 % kInterleaveRows == 0, "an interleaved GEMM starts at a group");
  if (g.m <= 0 || g.r1 <= g.r0) return;
  const int64_t nb = g.k / kQK_K;
  thread_local std::vector<RowGroup8K> group;
  if (group.size() < static_cast<size_t>(nb)) group.resize(static_cast<size_t>(nb));
  auto act_row = [&](int64_t t) { return reinterpret_cast<const BlockQ8_K*>(g.act + static_cast<size_t>(t) * g.act_stride); };
  // Activation rows per pass over a group (gemm_tiles::token_block).
  const int64_t token_block = gemm_tiles::token_block(nb * static_cast<int64_t>(sizeof(BlockQ8_K)));
  __m256 res[kQ6KTokens];
  gemm_tiles::repacked_walk<8>(
      g, token_block, kQ6KTokens, false,
      [&](int64_t row0, int nr) {
        if constexpr (kType == DType::kQ6_K) {
          gemm_tiles::unpack_q6_k_rows(g, row0, nr, nb, group.data());
        } else {
          unpack_rows8_q5_k(g, row0, nr, nb, group.data());
        }
      },
      [&](int64_t t, int nt, bool, int64_t row0, int nr) {
        const BlockQ8_K* acts[kQ6KTokens] = {};
        for (int i = 0; i < nt; ++i) acts[i] = act_row(t + i);
        gemm_tiles::with_count<kQ6KTokens>(nt, [&](auto cnt) { tile8_k<kType, cnt>(group.data(), nb, acts, res); });
        for (int i = 0; i < nt; ++i) gemm_tiles::store_rows8(g, t + i, row0, nr, res[i]);
      });
}

}  // namespace

GemmFn tiled_kernel(DType type) {
  switch (type) {
    case DType::kQ2_K:
      return &gemm_rows<DType::kQ2_K, RowTile<DType::kQ2_K, true>>;
    case DType::kQ3_K:
      return &gemm_rows<DType::kQ3_K, RowTile<DType::kQ3_K, true>>;
    case DType::kQ5_K:
      return &gemm_tiled_lanes<DType::kQ5_K>;  // rows in lanes: 1.5x the vec_dot tile with the tiled step (44 -> 67 GMAC/s)
    case DType::kQ6_K:
      return &gemm_tiled_lanes<DType::kQ6_K>;  // likewise 45.6 -> 67.5 GMAC/s
    case DType::kIQ4_XS:
      return &gemm_rows<DType::kIQ4_XS, RowTile<DType::kIQ4_XS, true>>;
    default:
      return nullptr;
  }
}

GemmFn kernel(DType type) {
  switch (type) {
    case DType::kQ4_K:
      return &gemm_rows<DType::kQ4_K>;
    case DType::kQ5_K:
      return &gemm_rows<DType::kQ5_K>;
    case DType::kQ6_K:
      return &gemm_rows<DType::kQ6_K>;
    case DType::kQ2_K:
      return &gemm_rows<DType::kQ2_K>;
    case DType::kQ3_K:
      return &gemm_rows<DType::kQ3_K>;
    case DType::kIQ4_XS:
      return &gemm_rows<DType::kIQ4_XS>;
    default:
      return nullptr;
  }
}

}  // namespace inferd::kernels::gemm_avx2_k
