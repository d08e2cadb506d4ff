// AVX2 GEMM for Q4_K, Q5_K and Q6_K weights (see inferd/kernels/gemm.h for the contract), for CPUs
// with AVX2, FMA and F16C but no AVX-512; and for Q2_K and Q3_K on AVX-512 CPUs too (their dot kernels
// have the same 8 lanes on both ISAs, so this GEMM equals both bit for bit).
//
// Numerics: every output is bit-identical to the AVX2 `dot` kernel of its type (x86_kernels.inc:
// dot_k_min for Q4_K/Q5_K, dot_q6_k_nr for Q6_K). One ymm per (weight row, activation row) holds the
// 8 float lanes; lane j's integer sum per super-block is the exact sum of maddubs(unsigned codes,
// signed activations) then madd with the int16 scale, as the dot kernel computes it (integers are
// exact in any order), and the float steps per block (k_min_float_step / q6_k_float_step) and the
// final reduction (k_min_result / hsum) are repeated operation for operation.
//
// Layout of the work: a weight super-block is decoded once per tile into 8 ymm of codes and 8 ymm of
// int16 scales (kept on the stack; L1 loads are cheaper than re-decoding), then every activation row
// of the tile walks it. Activation rows are read in place (Q8_K rows at act_stride); the tile walk
// counts them in pairs and an odd last row is simply computed twice.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "gemm_internal.h"
#include "gemm_tiles.h"
#include "inferd/status.h"
#include "isa_tables.h"
#include "x86_common.h"

namespace inferd::kernels::gemm_avx2_k {
namespace {

// Weight rows per tile and activation pairs per tile: kRows x 2 * kPairs float accumulators. 1 x 6
// measured best of 2x2, 1x2, 1x4, 4x1, 1x6 (k 2048 x 5632 rows x 128 tokens, one thread, Xeon capped to
// AVX2): +8% Q4_K, +16% Q5_K, +12% Q6_K over dot nr = 4; 2x2 was even and 4x1 15-30% slower.
constexpr int kRows = 1;
constexpr int kPairs = 6;
// Prefetch distance along the weight rows (as gemm_avx512.cpp).
constexpr int kPrefetchBytes = 4096;

// Row r of the tile is row row0 + r of g's matrix (Q4_K in either layout).
struct TileIo {
  const GemmArgs* g;
  int64_t row0;
  const BlockQ8_K* const* acts;  // the tile's 2 * P activation rows
  int64_t nb;
  float (*res)[2 * kPairs];  // [row][activation row]
};

// One weight super-block decoded: 32-byte chunk h holds the codes that meet activation bytes 32h..32h+31,
// scale[h] the int16 scale each pair of maddubs products is multiplied by.
struct Decoded {
  __m256i q[8];
  __m256i scale[8];
};

// The integer lane sums of one decoded block against one activation block (the dot kernel's sumi).
inline __m256i lane_sums(const Decoded& w, const int8_t* y) {
  __m256i sumi = _mm256_setzero_si256();
  for (int h = 0; h < 8; ++h) {
    const __m256i p16 = _mm256_maddubs_epi16(w.q[h], load32(y + 32 * h));
    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, w.scale[h]));
  }
  return sumi;
}

// Q4_K (kHigh = false) and Q5_K (kHigh = true).
template <bool kHigh, int R, int P>
void tile_k_min(const TileIo& io) {
  using Block = std::conditional_t<kHigh, BlockQ5_K, BlockQ4_K>;
  constexpr int T = 2 * P;
  gemm_tiles::KRowBlocks<Block> rows[R];
  for (int r = 0; r < R; ++r) rows[r] = gemm_tiles::k_row_blocks<Block>(*io.g, io.row0 + r);
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  __m256 acc[R][T];
  __m128 acc_m[R][T];
  float summs[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      acc[r][t] = _mm256_setzero_ps();
      acc_m[r][t] = _mm_setzero_ps();
      summs[r][t] = 0.0f;
    }
  }
  for (int64_t i = 0; i < io.nb; ++i) {
    // Per activation row: the 32-element sub-block sums bsum_2j + bsum_2j+1, as dot_k_min forms them.
    __m128i pairs[T];
    for (int t = 0; t < T; ++t) {
      const __m256i bsums = load32(io.acts[t][i].bsums);
      pairs[t] = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
    }
    for (int r = 0; r < R; ++r) {
      const gemm_tiles::KRowBlocks<Block>& b = rows[r];
      const char* ahead = reinterpret_cast<const char*>(b.qs(i, 0)) + kPrefetchBytes;
      for (size_t off = 0; off < sizeof(Block); off += 64) _mm_prefetch(ahead + off, _MM_HINT_T0);
      uint32_t sm[4];
      unpack_k4_scales(b.scales(i), sm);
      const __m128i sm_bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sm));
      const __m128i mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(sm_bytes, sm_bytes));
      const auto* sc = reinterpret_cast<const uint8_t*>(sm);
      Decoded w;
      [[maybe_unused]] __m256i hbits;
      if constexpr (kHigh) hbits = load32(b.qh(i));
      for (int c = 0; c < 4; ++c) {
        const __m256i x = load32(b.qs(i, c));
        __m256i lo = _mm256_and_si256(x, nibble);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), nibble);
        if constexpr (kHigh) {
          const __m256i one = _mm256_set1_epi8(1);
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hbits, one), 4));
          hbits = _mm256_srli_epi16(hbits, 1);
          hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(hbits, one), 4));
          hbits = _mm256_srli_epi16(hbits, 1);
        }
        w.q[2 * c] = lo;
        w.q[2 * c + 1] = hi;
        w.scale[2 * c] = _mm256_set1_epi16(sc[2 * c]);
        w.scale[2 * c + 1] = _mm256_set1_epi16(sc[2 * c + 1]);
      }
      const float d = h2f(b.d(i)), dmin = h2f(b.dmin(i));
      for (int t = 0; t < T; ++t) {
        const BlockQ8_K& a = io.acts[t][i];
        const __m256i sumi = lane_sums(w, a.qs);
        // k_min_float_step, operation for operation.
        const float da = a.d;
        const __m128i prod = _mm_madd_epi16(mins, pairs[t]);
        const float neg_dmin = -(da * dmin);
        if constexpr (kHigh) {
          __m128i s = _mm_add_epi32(prod, _mm_unpackhi_epi64(prod, prod));
          s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
          summs[r][t] = std::fma(neg_dmin, static_cast<float>(_mm_cvtsi128_si32(s)), summs[r][t]);
        } else {
          acc_m[r][t] = _mm_fmadd_ps(_mm_set1_ps(neg_dmin), _mm_cvtepi32_ps(prod), acc_m[r][t]);
        }
        acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(da * d), _mm256_cvtepi32_ps(sumi), acc[r][t]);
      }
    }
  }
  // k_min_result.
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      if constexpr (kHigh) {
        io.res[r][t] = gemm_tiles::reduce8(acc[r][t]) + summs[r][t];
      } else {
        __m128 m = _mm_add_ps(acc_m[r][t], _mm_movehl_ps(acc_m[r][t], acc_m[r][t]));
        m = _mm_add_ss(m, _mm_movehdup_ps(m));
        io.res[r][t] = gemm_tiles::reduce8(acc[r][t]) + _mm_cvtss_f32(m);
      }
    }
  }
}

template <int R, int P>
void tile_q6_k(const TileIo& io) {
  constexpr int T = 2 * P;
  gemm_tiles::Q6RowBlocks rows[R];
  for (int r = 0; r < R; ++r) rows[r] = gemm_tiles::q6_row_blocks(*io.g, io.row0 + r);
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i two_bits = _mm256_set1_epi8(0x30);
  const __m128i group_pair = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < io.nb; ++i) {
    for (int r = 0; r < R; ++r) {
      const gemm_tiles::Q6RowBlocks& b = rows[r];
      const char* ahead = reinterpret_cast<const char*>(b.ql(i, 0)) + kPrefetchBytes;
      for (size_t off = 0; off < sizeof(BlockQ6_K); off += 64) _mm_prefetch(ahead + off, _MM_HINT_T0);
      _mm_prefetch(ahead + sizeof(BlockQ6_K) - 1, _MM_HINT_T0);
      const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales(i)));
      // Quants +32 (0..63) of chunk c = 4 * half + t and chunk c's scales (groups 2c, 2c + 1), as
      // q6_k_quants and chunk_scales16 give them.
      Decoded w;
      for (int half = 0; half < 2; ++half) {
        const __m256i l0 = load32(b.ql(i, 2 * half));
        const __m256i l1 = load32(b.ql(i, 2 * half + 1));
        const __m256i hb = load32(b.qh(i, half));
        w.q[4 * half + 0] =
            _mm256_or_si256(_mm256_and_si256(l0, nibble), _mm256_and_si256(_mm256_slli_epi16(hb, 4), two_bits));
        w.q[4 * half + 1] =
            _mm256_or_si256(_mm256_and_si256(l1, nibble), _mm256_and_si256(_mm256_slli_epi16(hb, 2), two_bits));
        w.q[4 * half + 2] =
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), nibble), _mm256_and_si256(hb, two_bits));
        w.q[4 * half + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), nibble),
                                            _mm256_and_si256(_mm256_srli_epi16(hb, 2), two_bits));
      }
      for (int c = 0; c < 8; ++c) {
        const __m128i pick = _mm_add_epi8(group_pair, _mm_set1_epi8(static_cast<char>(2 * c)));
        w.scale[c] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pick));
      }
      const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
      const float d = h2f(b.d(i));
      for (int t = 0; t < T; ++t) {
        const BlockQ8_K& a = io.acts[t][i];
        const __m256i sumi = lane_sums(w, a.qs);
        // q6_k_float_step, operation for operation.
        const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(sc16, load32(a.bsums)), 5);
        const __m256i total = _mm256_sub_epi32(sumi, offset);
        acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(d * a.d), _mm256_cvtepi32_ps(total), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) io.res[r][t] = gemm_tiles::reduce8(acc[r][t]);
  }
}

// ---- Q2_K and Q3_K: chunk by chunk, the integer sums in registers ----
//
// Their weights decode into twice the registers of the 4-bit types (Q3_K: the two low bits and the
// "4 where the high bit is clear" of every chunk), so the tile turns the loop around: one weight row,
// and per 32-element chunk its codes and int16 scales stay in registers while the T activation rows'
// integer lane sums (one ymm each) take the chunk in turn. Per (activation row, chunk) that is one load
// and maddubs, madd, add (Q3_K: a second maddubs and a subtract, as ggml) with no decoded weights
// reloaded. The float steps per block are the dot kernels' (x86_kernels.inc, Q2K::step and Q3K::step),
// operation for operation: Q2_K's min term first, then the quant sums; the reduction is hsum's.
constexpr int kLowBitPairs = 4;

struct LowBitIo {
  const GemmArgs* g;
  int64_t row0;
  const BlockQ8_K* const* acts;  // the tile's 2 * P activation rows
  int64_t nb;
  float (*res)[2 * kLowBitPairs];  // [0][activation row]
};

// Q2_K (kThree = false) and Q3_K (kThree = true).
template <bool kThree, int R, int P>
void tile_low_bit(const LowBitIo& io) {
  static_assert(R == 1, "one weight row per tile");
  using Block = std::conditional_t<kThree, BlockQ3_K, BlockQ2_K>;
  constexpr int T = 2 * P;
  const auto* w = reinterpret_cast<const Block*>(io.g->w + static_cast<size_t>(io.row0) * io.g->w_row_bytes);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < io.nb; ++i) {
    const Block& b = w[i];
    const char* ahead = reinterpret_cast<const char*>(&b) + kPrefetchBytes;
    for (size_t off = 0; off < sizeof(Block); off += 64) _mm_prefetch(ahead + off, _MM_HINT_T0);
    __m128i sc8;
    [[maybe_unused]] __m256i hbits;
    if constexpr (kThree) {
      sc8 = unpack_q3_k_scales(b.scales);
      hbits = load32(b.hmask);
    } else {
      // Q2K::step's min term, before the quant sums.
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
      const __m128i m4 = _mm_set1_epi8(0xF);
      sc8 = _mm_and_si128(packed, m4);
      const __m256i mins16 = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4));
      const float dmin_w = h2f(b.dmin);
      for (int t = 0; t < T; ++t) {
        const BlockQ8_K& a = io.acts[t][i];
        const float dmin = -a.d * dmin_w;
        const __m256i prod = _mm256_madd_epi16(mins16, load32(a.bsums));
        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc[t]);
      }
    }
    __m256i sumi[T];
    for (int t = 0; t < T; ++t) sumi[t] = _mm256_setzero_si256();
    // Unrolled: each chunk's shift count and scale shuffle become constants.
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const __m256i low = two_bit_codes(b.qs, c);
      const __m256i s16 = chunk_scales16(sc8, c);
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
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(io.acts[t][i].d * d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) io.res[0][t] = gemm_tiles::reduce8(acc[t]);
}

template <DType kType>
struct LowBitTile {
  template <int R, int P>
  static void fn(const LowBitIo& io) {
    tile_low_bit<kType == DType::kQ3_K, R, P>(io);
  }
};

template <DType kType>
void gemm_low_bit(const GemmArgs& g) {
  INFERD_ASSERT(g.k % kQK_K == 0, "k must be a multiple of 256");
  INFERD_ASSERT(g.layout == WeightLayout::kRows, "%s has no interleaved layout", dtype_name(kType));
  if (g.m <= 0 || g.r1 <= g.r0) return;
  const int64_t nb = g.k / kQK_K;
  const int64_t npairs = (g.m + 1) / 2;
  gemm_tiles::walk<1, kLowBitPairs>(g, npairs, [&](int64_t r, int nr, int64_t p0, int np, float (*res)[2 * kLowBitPairs]) {
    const BlockQ8_K* acts[2 * kLowBitPairs];
    for (int t = 0; t < 2 * np; ++t) {
      const int64_t row = std::min(2 * p0 + t, g.m - 1);  // an odd last row is computed twice
      acts[t] = reinterpret_cast<const BlockQ8_K*>(g.act + static_cast<size_t>(row) * g.act_stride);
    }
    gemm_tiles::TileTable<LowBitTile<kType>, 1, kLowBitPairs>::kTable[nr - 1][np - 1](
        LowBitIo{&g, r, acts, nb, res});
  });
}

template <DType kType>
struct TileOf {
  template <int R, int P>
  static void fn(const TileIo& io) {
    if constexpr (kType == DType::kQ4_K) {
      tile_k_min<false, R, P>(io);
    } else if constexpr (kType == DType::kQ5_K) {
      tile_k_min<true, R, P>(io);
    } else {
      tile_q6_k<R, P>(io);
    }
  }
};

template <DType kType>
void gemm(const GemmArgs& g) {
  INFERD_ASSERT(g.k % kQK_K == 0, "k must be a multiple of 256");
  INFERD_ASSERT(g.layout == WeightLayout::kRows || (interleavable(kType) && g.r0 % kInterleaveRows == 0),
                "an interleaved GEMM starts at a group");
  if (g.m <= 0 || g.r1 <= g.r0) return;
  const int64_t nb = g.k / kQK_K;
  const int64_t npairs = (g.m + 1) / 2;
  gemm_tiles::walk<kRows, kPairs>(g, npairs, [&](int64_t r, int nr, int64_t p0, int np, float (*res)[2 * kPairs]) {
    const BlockQ8_K* acts[2 * kPairs];
    for (int t = 0; t < 2 * np; ++t) {
      const int64_t row = std::min(2 * p0 + t, g.m - 1);  // an odd last row is computed twice
      acts[t] = reinterpret_cast<const BlockQ8_K*>(g.act + static_cast<size_t>(row) * g.act_stride);
    }
    const TileIo io{&g, r, acts, nb, res};
    gemm_tiles::TileTable<TileOf<kType>, kRows, kPairs>::kTable[nr - 1][np - 1](io);
  });
}

}  // namespace

GemmFn kernel(DType type) {
  switch (type) {
    case DType::kQ4_K:
      return &gemm<DType::kQ4_K>;
    case DType::kQ5_K:
      return &gemm<DType::kQ5_K>;
    case DType::kQ6_K:
      return &gemm<DType::kQ6_K>;
    case DType::kQ2_K:
      return &gemm_low_bit<DType::kQ2_K>;
    case DType::kQ3_K:
      return &gemm_low_bit<DType::kQ3_K>;
    default:
      return nullptr;
  }
}

}  // namespace inferd::kernels::gemm_avx2_k
