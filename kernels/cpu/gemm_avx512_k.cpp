// AVX-512 VNNI GEMM for Q4_K, Q5_K and Q6_K weights (see inferd/kernels/gemm.h for the contract).
//
// Numerics: every output is bit-identical to this library's x86 `dot` kernels for the type (and so to
// ggml's AVX2 vec_dot): per 256-element super-block, 8 int32 lanes where lane j holds the exact sum,
// over the block's 32-byte chunks, of scale(chunk, j) * (the products of bytes 4j..4j+3); one fused
// multiply-add per lane with d_w * d_a; Q4_K's min term in 4 float lanes of its own; ggml's
// reductions. Only the integer work is reorganised, and integers are exact in any order.
//
// Layout of the work, as in gemm_avx512.cpp: the activation rows are packed once per call in pairs
// (KPairBlock: both rows' 32-byte half-chunks side by side in one zmm, their scales and block sums), a
// weight half-chunk is decoded once per tile into one zmm holding it twice, and one vpdpbusd gives the
// 4-byte lane sums of two activation rows (lanes 0..7 row t, 8..15 row t + 1). The per-chunk scale is
// applied with vpdpwssd: a lane sum fits in int16 (|sum| <= 4 * 63 * 127), so reading each int32 lane
// as the int16 pair (sum, sign) and multiplying by the pair (scale, 0) adds scale * sum exactly.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <type_traits>
#include <cstring>
#include <vector>

#include "gemm_internal.h"
#include "gemm_tiles.h"
#include "inferd/status.h"
#include "isa_tables.h"
#include "x86_common.h"

namespace inferd::kernels::gemm_avx512_k {
namespace {

struct alignas(64) KPairBlock {
  int8_t q[8][64];        // half-chunk h: bytes 32h..32h+31 of activation row t, then of row t + 1
  float d[16];            // d_a of row t (lanes 0..7) and row t + 1 (8..15)
  int16_t bsums[32];      // Q6_K: the 16 block sums of row t, then those of row t + 1
  int16_t pair_sums[16];  // Q4_K: bsum_2j + bsum_2j+1 (32-element sub-block sums) of row t, then row t + 1
  float d4[8];            // Q4_K: d_a of row t (lanes 0..3) and row t + 1 (4..7)
};
static_assert(sizeof(KPairBlock) == 704);

// Weight rows per tile and activation pairs per tile. One row: its 8 decoded half-chunks plus the 6
// pairs' 12 accumulators stay in the 32 zmm registers, where two rows made GCC keep the accumulators
// on the stack, indexed by row (single thread, `inferd-gemm-bench gemm`, 2048 x 5632 x 128, GMAC/s:
// Q4_K 80 -> 91, Q5_K 63 -> 66, Q6_K 81 -> 85 for 2 x 6 -> 1 x 6; 1 x 5, 1 x 7, 1 x 8, 2 x 4, 3 x 4
// no better for Q4_K. 1.1B Q4_K_M prefill, 2 threads: 137 -> 148 tok/s).
constexpr int kRows = 1;
constexpr int kPairs = 6;
// No software prefetch: the weight rows are sequential streams the hardware prefetcher follows, and a
// prefetch 4 KiB ahead made 1.1B Q4_K_M prefill 6-8% slower (AMD EPYC, Zen 4; the AVX2 GEMMs keep theirs,
// which gains there).

std::vector<KPairBlock>& scratch() {
  thread_local std::vector<KPairBlock> s;
  return s;
}

void pack_pairs(const GemmArgs& g, int64_t nb, int64_t npairs, KPairBlock* out) {
  for (int64_t p = 0; p < npairs; ++p) {
    const int64_t t0 = 2 * p;
    const int64_t t1 = std::min(t0 + 1, g.m - 1);  // an odd last row is paired with itself
    const auto* a0 = reinterpret_cast<const BlockQ8_K*>(g.act + static_cast<size_t>(t0) * g.act_stride);
    const auto* a1 = reinterpret_cast<const BlockQ8_K*>(g.act + static_cast<size_t>(t1) * g.act_stride);
    KPairBlock* dst = out + p * nb;
    for (int64_t b = 0; b < nb; ++b) {
      KPairBlock& k = dst[b];
      for (int h = 0; h < 8; ++h) {
        std::memcpy(k.q[h], a0[b].qs + 32 * h, 32);
        std::memcpy(k.q[h] + 32, a1[b].qs + 32 * h, 32);
      }
      for (int j = 0; j < 8; ++j) {
        k.d[j] = a0[b].d;
        k.d[8 + j] = a1[b].d;
      }
      for (int j = 0; j < 4; ++j) {
        k.d4[j] = a0[b].d;
        k.d4[4 + j] = a1[b].d;
      }
      std::memcpy(k.bsums, a0[b].bsums, sizeof(a0[b].bsums));
      std::memcpy(k.bsums + 16, a1[b].bsums, sizeof(a1[b].bsums));
      for (int j = 0; j < 8; ++j) {
        // int16 wrap-around as _mm_hadd_epi16 (never reached: |bsum| <= 16 * 127).
        k.pair_sums[j] = static_cast<int16_t>(a0[b].bsums[2 * j] + a0[b].bsums[2 * j + 1]);
        k.pair_sums[8 + j] = static_cast<int16_t>(a1[b].bsums[2 * j] + a1[b].bsums[2 * j + 1]);
      }
    }
  }
}

// ggml's reduction of Q4_K's 4 min lanes: (m0 + m2) + (m1 + m3).
inline float reduce4(__m128 m) {
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// 32 bytes placed in both 256-bit halves of a zmm.
inline __m512i twice(__m256i v) { return _mm512_inserti64x4(_mm512_castsi256_si512(v), v, 1); }

// Row r of the tile is row row0 + r of g's matrix (Q4_K in either layout).
struct TileIo {
  const GemmArgs* g;
  int64_t row0;
  const KPairBlock* pairs;  // [pair][block], nb blocks per pair
  int64_t nb;
  float (*res)[2 * kPairs];  // [row][activation row]
};

// Q4_K (kHigh = false) and Q5_K (kHigh = true, fifth bits from qh; its min term is one scalar per
// activation row, as in dot_k_min, kept here in lanes 0 and 1 of summs).
template <bool kHigh, int R, int P>
void tile_k_min(const TileIo& io) {
  using Block = std::conditional_t<kHigh, BlockQ5_K, BlockQ4_K>;
  const int64_t nb = io.nb;
  gemm_tiles::KRowBlocks<Block> rows[R];
  for (int r = 0; r < R; ++r) rows[r] = gemm_tiles::k_row_blocks<Block>(*io.g, io.row0 + r);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m512 acc[R][P];
  __m256 acc_m[R][P];
  [[maybe_unused]] __m128 summs[R][P];
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) {
      acc[r][p] = _mm512_setzero_ps();
      acc_m[r][p] = _mm256_setzero_ps();
      if constexpr (kHigh) summs[r][p] = _mm_setzero_ps();
    }
  }
  for (int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < R; ++r) {
      const gemm_tiles::KRowBlocks<Block>& blk = rows[r];
      alignas(16) uint32_t sm_words[4];
      unpack_k4_scales(blk.scales(b).v, sm_words);
      const auto* sm = reinterpret_cast<const uint8_t*>(sm_words);  // scales 0..7, mins 8..15
      __m512i wq[8];
      [[maybe_unused]] __m512i hbits;
      if constexpr (kHigh) hbits = twice(load32(blk.qh(b)));
      for (int c = 0; c < 4; ++c) {
        const __m512i x = twice(blk.chunk(b, c));
        wq[2 * c] = _mm512_and_si512(x, nibble);
        wq[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(x, 4), nibble);
        if constexpr (kHigh) {
          // Bit 2c of qh[l] is the fifth bit of low-nibble element l, bit 2c + 1 that of the high one.
          const __m512i one = _mm512_set1_epi8(1);
          wq[2 * c] = _mm512_or_si512(wq[2 * c], _mm512_slli_epi16(_mm512_and_si512(hbits, one), 4));
          hbits = _mm512_srli_epi16(hbits, 1);
          wq[2 * c + 1] = _mm512_or_si512(wq[2 * c + 1], _mm512_slli_epi16(_mm512_and_si512(hbits, one), 4));
          hbits = _mm512_srli_epi16(hbits, 1);
        }
      }
      // mins[0..7] for row t and again for row t + 1, as int16.
      const __m128i mins8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm + 8));
      const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(mins8, mins8));
      const __m512 d = _mm512_set1_ps(h2f(blk.d(b)));
      const __m256 dmin = _mm256_set1_ps(h2f(blk.dmin(b)));
      for (int p = 0; p < P; ++p) {
        const KPairBlock& pb = io.pairs[p * nb + b];
        __m512i sumi = _mm512_setzero_si512();
        for (int h = 0; h < 8; ++h) {
          const __m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[h], _mm512_load_si512(pb.q[h]));
          sumi = _mm512_dpwssd_epi32(sumi, dp, _mm512_set1_epi32(sm[h]));
        }
        const __m512 da = _mm512_load_ps(pb.d);
        acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(da, d), _mm512_cvtepi32_ps(sumi), acc[r][p]);
        const __m256i prod = _mm256_madd_epi16(mins16, _mm256_load_si256(reinterpret_cast<const __m256i*>(pb.pair_sums)));
        const __m256 neg_dmin = _mm256_xor_ps(_mm256_mul_ps(_mm256_load_ps(pb.d4), dmin), sign);
        if constexpr (kHigh) {
          // Each row's 4 lanes summed as integers (lane 0: row t, lane 4: row t + 1), then one fma each.
          __m256i t = _mm256_hadd_epi32(prod, prod);
          t = _mm256_hadd_epi32(t, t);
          const __m128i both = _mm_unpacklo_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
          const __m128 nd = _mm_shuffle_ps(_mm256_castps256_ps128(neg_dmin), _mm256_extractf128_ps(neg_dmin, 1),
                                           _MM_SHUFFLE(0, 0, 0, 0));  // lanes: row t, row t, row t+1, row t+1
          const __m128 nd2 = _mm_shuffle_ps(nd, nd, _MM_SHUFFLE(2, 2, 2, 0));
          summs[r][p] = _mm_fmadd_ps(nd2, _mm_cvtepi32_ps(both), summs[r][p]);
        } else {
          acc_m[r][p] = _mm256_fmadd_ps(neg_dmin, _mm256_cvtepi32_ps(prod), acc_m[r][p]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) {
      if constexpr (kHigh) {
        alignas(16) float sm2[4];
        _mm_store_ps(sm2, summs[r][p]);
        io.res[r][2 * p] = gemm_tiles::reduce8(_mm512_castps512_ps256(acc[r][p])) + sm2[0];
        io.res[r][2 * p + 1] = gemm_tiles::reduce8(_mm512_extractf32x8_ps(acc[r][p], 1)) + sm2[1];
      } else {
        io.res[r][2 * p] = gemm_tiles::reduce8(_mm512_castps512_ps256(acc[r][p])) + reduce4(_mm256_castps256_ps128(acc_m[r][p]));
        io.res[r][2 * p + 1] =
            gemm_tiles::reduce8(_mm512_extractf32x8_ps(acc[r][p], 1)) + reduce4(_mm256_extractf128_ps(acc_m[r][p], 1));
      }
    }
  }
}

template <int R, int P>
void tile_q6_k(const TileIo& io) {
  const int64_t nb = io.nb;
  gemm_tiles::Q6RowBlocks rows[R];
  for (int r = 0; r < R; ++r) rows[r] = gemm_tiles::q6_row_blocks(*io.g, io.row0 + r);
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i two_bits = _mm256_set1_epi8(0x30);
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < R; ++r) {
      const gemm_tiles::Q6RowBlocks& blk = rows[r];
      // Quants +32 (0..63) of chunk c = 4 * half + t, as in the dot kernel.
      __m512i wq[8];
      for (int half = 0; half < 2; ++half) {
        const __m256i l0 = load32(blk.ql(b, 2 * half));
        const __m256i l1 = load32(blk.ql(b, 2 * half + 1));
        const __m256i hb = load32(blk.qh(b, half));
        wq[4 * half + 0] = twice(
            _mm256_or_si256(_mm256_and_si256(l0, nibble), _mm256_and_si256(_mm256_slli_epi16(hb, 4), two_bits)));
        wq[4 * half + 1] = twice(
            _mm256_or_si256(_mm256_and_si256(l1, nibble), _mm256_and_si256(_mm256_slli_epi16(hb, 2), two_bits)));
        wq[4 * half + 2] = twice(
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), nibble), _mm256_and_si256(hb, two_bits)));
        wq[4 * half + 3] = twice(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), nibble),
                                                 _mm256_and_si256(_mm256_srli_epi16(hb, 2), two_bits)));
      }
      // Chunk c's scales as (scale, 0) int16 pairs: lanes 0..3 group 2c, lanes 4..7 group 2c + 1, twice.
      __m512i scale_pairs[8];
      for (int c = 0; c < 8; ++c) {
        const int32_t s0 = static_cast<uint16_t>(static_cast<int16_t>(blk.scales(b)[2 * c]));
        const int32_t s1 = static_cast<uint16_t>(static_cast<int16_t>(blk.scales(b)[2 * c + 1]));
        const __m512i lo = _mm512_set1_epi32(s0), hi = _mm512_set1_epi32(s1);
        scale_pairs[c] = _mm512_mask_blend_epi32(0xF0F0, lo, hi);
      }
      // The 16 scales as int16, for row t and again for row t + 1.
      const __m256i sc16 =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.scales(b))));
      const __m512i sc16x2 = _mm512_inserti64x4(_mm512_castsi256_si512(sc16), sc16, 1);
      const __m512 d = _mm512_set1_ps(h2f(blk.d(b)));
      for (int p = 0; p < P; ++p) {
        const KPairBlock& pb = io.pairs[p * nb + b];
        __m512i sumi = _mm512_setzero_si512();
        for (int c = 0; c < 8; ++c) {
          const __m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[c], _mm512_load_si512(pb.q[c]));
          sumi = _mm512_dpwssd_epi32(sumi, dp, scale_pairs[c]);
        }
        const __m512i offset = _mm512_slli_epi32(_mm512_madd_epi16(sc16x2, _mm512_load_si512(pb.bsums)), 5);
        const __m512i total = _mm512_sub_epi32(sumi, offset);
        acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_load_ps(pb.d)), _mm512_cvtepi32_ps(total), acc[r][p]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) {
      io.res[r][2 * p] = gemm_tiles::reduce8(_mm512_castps512_ps256(acc[r][p]));
      io.res[r][2 * p + 1] = gemm_tiles::reduce8(_mm512_extractf32x8_ps(acc[r][p], 1));
    }
  }
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
  std::vector<KPairBlock>& pairs = scratch();
  if (pairs.size() < static_cast<size_t>(npairs * nb)) pairs.resize(static_cast<size_t>(npairs * nb));
  pack_pairs(g, nb, npairs, pairs.data());
  gemm_tiles::RowLayoutView view(g);
  gemm_tiles::walk<kRows, kPairs>(
      g, npairs,
      [&](int64_t r, int nr, int64_t p0, int np, float (*res)[2 * kPairs]) {
        const TileIo io{&view.args(), view.row(r), pairs.data() + p0 * nb, nb, res};
        gemm_tiles::TileTable<TileOf<kType>, kRows, kPairs>::kTable[nr - 1][np - 1](io);
      },
      [&](int64_t rc, int64_t rc_end) { view.load(rc, rc_end); });
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
    default:
      return nullptr;
  }
}

}  // namespace inferd::kernels::gemm_avx512_k
