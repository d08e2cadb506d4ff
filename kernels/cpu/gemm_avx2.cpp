// AVX2 GEMM for Q4_0, Q4_1, Q5_0, Q8_0 and IQ4_NL weights (see inferd/kernels/gemm.h for the contract),
// for CPUs with AVX2, FMA and F16C but no AVX-512 (and for IQ4_NL on AVX-512 CPUs too: its AVX-512
// kernels have the same lanes, so this GEMM equals them bit for bit there as well).
//
// Two tilings. From 8 activation rows on, Q4_0, Q4_1 and Q5_0 take the "rows in lanes" tile (below,
// gemm_lanes): 8 weight rows per register, no per-row scale permute; 1.3x the pair tile on the 1.1B Q4_0
// prefill (AMD EPYC Zen 3, BENCHMARKS.md). Q8_0 takes its own rows-in-lanes tile on int16 codes
// (gemm_lanes_q8_0). IQ4_NL and steps of fewer rows take the pair tile described next.
//
// Layout of the work. The activation rows are first packed, once per call, into ActBlocks (a row's
// 32 quants of one block and the integer start value of each of the 8 int32 lanes) and into
// activation scales in the tile's lane order. Rows are padded to an even count (the last row
// repeated) so that the shared tile walk (gemm_tiles.h, which counts activation rows in pairs)
// always hands over whole tiles. A weight block is decoded once per tile into one ymm; one ymm
// accumulator per (weight row, activation row) holds the contract's 8 lanes. A tile is kRows = 2
// weight rows x kCols = 4 activation rows, run over all blocks of k: 8 accumulators leave room for
// the decoded weights without spills (4 x 2 spilled and ran 15% slower on a Xeon with AVX-512
// capped to AVX2).
//
// The 8 block scales d_w * d_a of a tile come from one vector multiply per block and reach their
// accumulators by vpermps (port 5), which keeps ports 0/1 for maddubs, madd, cvt and fma: per
// (row, activation row, block) that is the whole float work besides the contract's one fma.
//
// Integer steps (all exact; no int16 pair of maddubs saturates):
//  - Q4_0 and Q4_1 weights enter maddubs as unsigned nibbles 0..15 (|pair| <= 2 * 15 * 128); Q4_0's
//    offset of 8 is removed by the lane's start value, -8 times the lane's activation sum. Q5_0's
//    codes are nibble + 16 * fifth bit, 0..31 (|pair| <= 2 * 31 * 128), offset 16 removed likewise.
//  - Q8_0 weights in the pair tile use ggml's sign trick: |w| (0..128 as u8) times sign(a, w) (|a| <= 127,
//    as the activation quantizer produces), |pair| <= 2 * 128 * 127 < 32768 (its rows-in-lanes tile widens
//    both sides to int16 instead: gemm_lanes_q8_0). IQ4_NL's codes are looked up into their signed values
//    (-127..113) and take the same path.
// IQ4_NL is the one type whose GEMM order is not its dot kernel's: ggml's vec_dot pairs its blocks into
// two accumulators, while the matmuls of two or more activation rows go through llamafile's tinyBLAS,
// which accumulates block after block into one, as here (tested against that order).
// Float steps per lane are exactly the contract's: scale = d_w * d_a (fp32), acc = fma(scale,
// float(n), acc), block by block; Q4_1's summs = fma(m_w, s_a, summs) block by block, added last.
//
// At the end of the file: Q4_0's, IQ4_NL's and Q4_K's GEMMs in MatmulOrder::kRepacked (inferd/kernels/cpu.h),
// llama.cpp's repacked orders, with their own rows-in-lanes tiles.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "gemm_internal.h"
#include "gemm_tiles.h"
#include "inferd/status.h"
#include "isa_tables.h"
#include "x86_common.h"

namespace inferd::kernels::gemm_avx2 {
namespace {

struct alignas(32) ActBlock {
  int8_t a[32];      // the activation row's quants of this block
  int32_t start[8];  // initial value of each int32 lane (Q4_0: -8 * lane sum; Q5_0: -16 *; else 0)
};
static_assert(sizeof(ActBlock) == 64);

// Weight rows per tile and activation pairs per tile (the register tile is kRows x 2 * kPairs ymm).
constexpr int kRows = 2;
constexpr int kPairs = 2;
constexpr int kCols = 2 * kPairs;
// The tile's kRows x kCols block scales d_w * d_a come from one 8-lane multiply per block; lane
// t * kRows + r belongs to weight row r and activation row t of the tile.
static_assert(kRows * kCols == 8 && (kRows == 2 || kRows == 4), "tile() builds the 8 weight scales from one xmm");
// Prefetch distance along the weight rows (as gemm_avx512.cpp).
constexpr int kPrefetchBytes = 4096;

struct Scratch {
  std::vector<ActBlock> acts;     // [activation row][block], rows padded to an even count
  std::vector<float> act_scales;  // [group of kCols rows][block][lane t * kRows + r]: d_a of row t
  std::vector<float> act_sums;    // Q4_1: s_a of [block][token], m_pad tokens per block
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

using gemm_tiles::Traits;
using gemm_tiles::broadcast32;
using gemm_tiles::store_rows8;
using gemm_tiles::transpose8;

template <DType kType>
void pack_acts(const GemmArgs& g, int64_t nb, int64_t rows, ActBlock* out, float* scales) {
  using ABlock = typename Traits<kType>::ABlock;
  const float* half = scalar::fp16_table();
  const __m256i bias = _mm256_set1_epi8(kType == DType::kQ5_0 ? 16 : 8);
  const __m256i ones16 = _mm256_set1_epi16(1);
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t src_t = std::min(t, g.m - 1);
    const auto* a = reinterpret_cast<const ABlock*>(g.act + static_cast<size_t>(src_t) * g.act_stride);
    ActBlock* dst = out + t * nb;
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i q = load32(a[b].qs);
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst[b].a), q);
      __m256i start = _mm256_setzero_si256();
      if constexpr (kType == DType::kQ4_0 || kType == DType::kQ5_0) {
        // -bias * sum of the lane's four quants: maddubs(bias, q) is exact (|pair| <= 2 * 16 * 128).
        start = _mm256_sub_epi32(start, _mm256_madd_epi16(_mm256_maddubs_epi16(bias, q), ones16));
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst[b].start), start);
    }
  }
  // Groups past the last row (a ragged last tile) repeat the last row: finite, never stored.
  const int64_t groups = (rows + kCols - 1) / kCols;
  for (int64_t grp = 0; grp < groups; ++grp) {
    for (int t = 0; t < kCols; ++t) {
      const int64_t src_t = std::min(grp * kCols + t, g.m - 1);
      const auto* a = reinterpret_cast<const ABlock*>(g.act + static_cast<size_t>(src_t) * g.act_stride);
      for (int64_t b = 0; b < nb; ++b) {
        for (int r = 0; r < kRows; ++r) scales[(grp * nb + b) * 8 + t * kRows + r] = half[a[b].d];
      }
    }
  }
}

// One tile's inputs and outputs. Row r of the tile is weight row row0 + r of g's matrix (either layout
// for Q4_0, Q4_1, Q5_0 and Q8_0; the row layout for IQ4_NL); acts and act_sums start at the tile's
// first activation row.
struct TileIo {
  const GemmArgs* g;
  int64_t row0;
  const ActBlock* acts;      // [activation row][block], nb blocks per row
  const float* act_scales;  // [block][8]: the tile's activation scales in lane order
  int64_t nb;
  const float* act_sums;  // Q4_1: s_a as [block][token], m_pad tokens per block
  int64_t m_pad;
  float (*res)[kCols];    // [row][activation row]: the reduced lane sums
  float (*summs)[kCols];  // Q4_1: [row][activation row]: the summs of the contract
};

// The register tile: R weight rows x 2 * P activation rows over all nb blocks.
template <DType kType, int R, int P>
void tile(const TileIo& io) {
  using WBlock = typename Traits<kType>::WBlock;
  constexpr int T = 2 * P;
  static_assert(T <= 4, "Q4_1's summs hold 4 activation rows per xmm");
  const float* half = scalar::fp16_table();
  const int64_t nb = io.nb;
  const ActBlock* acts = io.acts;
  gemm_tiles::RowBlocks<WBlock> rows[R];
  for (int r = 0; r < R; ++r) rows[r] = gemm_tiles::row_blocks<WBlock>(*io.g, io.row0 + r);
  [[maybe_unused]] __m128 summs[R];
  if constexpr (kType == DType::kQ4_1) {
    for (int r = 0; r < R; ++r) summs[r] = _mm_setzero_ps();
  }
  const __m256i ones16 = _mm256_set1_epi16(1);
  [[maybe_unused]] const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  [[maybe_unused]] const __m256i nibble_shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    uint64_t dw_bits = 0;              // fp16 d_w of the tile's weight rows, row r in bits 16r..16r+15
    __m256i wq[R];                     // Q4: nibbles 0..15; Q8_0, IQ4_NL: the signed values
    [[maybe_unused]] __m256i wabs[R];  // Q8_0, IQ4_NL: |w| as u8
    for (int r = 0; r < R; ++r) {
      const uint8_t* qs = rows[r].qs(b);
      // The first activation tile over a chunk streams its weights from memory (later ones find
      // them in L2): ask for them ahead, as the decode GEMV does.
      _mm_prefetch(reinterpret_cast<const char*>(qs) + kPrefetchBytes, _MM_HINT_T0);
      if constexpr (kType == DType::kQ8_0) {
        wq[r] = load32(qs);
        wabs[r] = _mm256_sign_epi8(wq[r], wq[r]);
      } else if constexpr (kType == DType::kIQ4_NL) {
        wq[r] = iq4_values(qs);
        wabs[r] = _mm256_sign_epi8(wq[r], wq[r]);
      } else {
        // Low nibbles (elements 0..15) in the low 128 bits, high nibbles (16..31) in the high.
        const __m256i both = _mm256_broadcastsi128_si256(rows[r].qs16(b));
        wq[r] = _mm256_and_si256(_mm256_srlv_epi32(both, nibble_shift), low_nibbles);
        if constexpr (kType == DType::kQ5_0) {
          // The fifth bit of element i is bit i of qh: 16 where it is set.
          const uint32_t qh = rows[r].qh(b);
          const __m256i spread = _mm256_shuffle_epi8(
              _mm256_set1_epi32(static_cast<int>(qh)),
              _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
          const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
          const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
          wq[r] = _mm256_or_si256(wq[r], _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
        }
      }
      dw_bits |= static_cast<uint64_t>(rows[r].d(b)) << (16 * r);
    }
    // Built in registers: 16-bit stores read back as one vector stall store forwarding, and a
    // scale array in memory made GCC 12 keep the accumulators in memory too (both measured).
    const __m128 dw = _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(dw_bits)));
    __m256 dw_lanes;
    if constexpr (kRows == 4) {
      dw_lanes = _mm256_set_m128(dw, dw);
    } else {
      dw_lanes = _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(dw)));
    }
    const __m256 scale = _mm256_mul_ps(dw_lanes, _mm256_loadu_ps(io.act_scales + 8 * b));
    if constexpr (kType == DType::kQ4_1) {
      const __m128 sa = _mm_loadu_ps(io.act_sums + b * io.m_pad);
      for (int r = 0; r < R; ++r) summs[r] = _mm_fmadd_ps(_mm_set1_ps(half[rows[r].m(b)]), sa, summs[r]);
    }
    for (int t = 0; t < T; ++t) {
      const ActBlock& ab = acts[t * nb + b];
      const __m256i aq = _mm256_load_si256(reinterpret_cast<const __m256i*>(ab.a));
      for (int r = 0; r < R; ++r) {
        __m256i n;
        if constexpr (kType == DType::kQ8_0 || kType == DType::kIQ4_NL) {
          n = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs[r], _mm256_sign_epi8(aq, wq[r])), ones16);
        } else {
          n = _mm256_madd_epi16(_mm256_maddubs_epi16(wq[r], aq), ones16);
          if constexpr (kType == DType::kQ4_0 || kType == DType::kQ5_0) {
            n = _mm256_add_epi32(n, _mm256_load_si256(reinterpret_cast<const __m256i*>(ab.start)));
          }
        }
        const __m256 s = _mm256_permutevar8x32_ps(scale, _mm256_set1_epi32(t * kRows + r));
        acc[r][t] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(n), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) io.res[r][t] = gemm_tiles::reduce8(acc[r][t]);
    if constexpr (kType == DType::kQ4_1) {
      alignas(16) float s[4];
      _mm_store_ps(s, summs[r]);
      for (int t = 0; t < T; ++t) io.summs[r][t] = s[t];
    }
  }
}

template <DType kType>
struct TileOf {
  template <int R, int P>
  static void fn(const TileIo& io) {
    tile<kType, R, P>(io);
  }
};

// ---- Rows in lanes: the tile for prefill steps of many tokens (Q4_0, Q4_1, Q5_0) ----
//
// A ymm's 8 lanes are 8 weight rows and the contract's 8 lanes are 8 registers: acc[i] holds lane i of
// (row r, activation row t) in its lane r. The 8 rows' scales d_w * d_a are one multiply per block, the
// activation's 4 bytes of lane i are a broadcast, and nothing is permuted per row: per (row, activation
// row, block) the work is the contract's cvt and fma plus maddubs, madd and the start value's add (Q4_1:
// none). The
// weights of 8 rows are unpacked once per token block into RowGroup8 blocks (codes transposed to dword i
// of 8 rows) and read by every activation row from L1/L2.

// One block column of 8 rows, unpacked: lane r of codes[i] holds row r's codes of elements 4i..4i+3 as
// unsigned bytes (the nibble; Q5_0: nibble + 16 * fifth bit); d its scale, m (Q4_1) its min. Rows past the range
// are zero.
struct alignas(32) RowGroup8 {
  uint32_t codes[8][8];
  float d[8];
  float m[8];
};
static_assert(sizeof(RowGroup8) == 320);

// One activation row's block: its quants as 8 dwords (elements 4i..4i+3), each lane's start value, its
// scale and (Q4_1) s.
struct LaneActBlock {
  int32_t q[8];
  int32_t start[8];
  float d;
  float s;
};
static_assert(sizeof(LaneActBlock) == 72);

struct LaneScratch {
  std::vector<LaneActBlock> acts;  // [activation row][block]
  std::vector<RowGroup8> group;    // [block] of the current 8 rows
};

LaneScratch& lane_scratch() {
  thread_local LaneScratch s;
  return s;
}

template <DType kType>
void pack_lane_acts(const GemmArgs& g, int64_t nb, LaneActBlock* out) {
  using ABlock = typename Traits<kType>::ABlock;
  const float* half = scalar::fp16_table();
  const __m256i bias = _mm256_set1_epi8(kType == DType::kQ5_0 ? 16 : 8);
  const __m256i ones16 = _mm256_set1_epi16(1);
  for (int64_t t = 0; t < g.m; ++t) {
    const auto* a = reinterpret_cast<const ABlock*>(g.act + static_cast<size_t>(t) * g.act_stride);
    LaneActBlock* dst = out + t * nb;
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i q = load32(a[b].qs);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst[b].q), q);
      __m256i start = _mm256_setzero_si256();
      if constexpr (kType == DType::kQ4_0 || kType == DType::kQ5_0) {
        // -bias * sum of the lane's four quants (exact, as in pack_acts).
        start = _mm256_sub_epi32(start, _mm256_madd_epi16(_mm256_maddubs_epi16(bias, q), ones16));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst[b].start), start);
      dst[b].d = half[a[b].d];
      if constexpr (kType == DType::kQ4_1) {
        dst[b].s = half[a[b].s];
      } else {
        dst[b].s = 0.0f;
      }
    }
  }
}

// The 32 codes of row `r`'s block b as bytes in element order (the tile() decoding, whole block): unsigned
// for the 4- and 5-bit types, IQ4_NL's signed values.
template <DType kType>
inline __m256i row_codes(const gemm_tiles::RowBlocks<typename Traits<kType>::WBlock>& row, int64_t b) {
  if constexpr (kType == DType::kIQ4_NL) {
    return iq4_values(row.qs(b));  // the signed non-linear values
  } else {
    const __m256i both = _mm256_broadcastsi128_si256(row.qs16(b));
    __m256i codes = _mm256_and_si256(_mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
                                     _mm256_set1_epi8(0x0F));
    if constexpr (kType == DType::kQ5_0) {
      const uint32_t qh = row.qh(b);
      const __m256i spread = _mm256_shuffle_epi8(
          _mm256_set1_epi32(static_cast<int>(qh)),
          _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
      const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
      codes = _mm256_or_si256(codes, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
    return codes;
  }
}

// Rows row0 .. row0 + nr - 1 (nr <= 8) of g's matrix, all nb blocks, into out.
template <DType kType>
void unpack_rows8(const GemmArgs& g, int64_t row0, int nr, int64_t nb, RowGroup8* out) {
  using WBlock = typename Traits<kType>::WBlock;
  const float* half = scalar::fp16_table();
  gemm_tiles::RowBlocks<WBlock> rows[8];
  for (int r = 0; r < nr; ++r) rows[r] = gemm_tiles::row_blocks<WBlock>(g, row0 + r);
  for (int64_t b = 0; b < nb; ++b) {
    __m256i y[8];
    for (int r = 0; r < 8; ++r) y[r] = r < nr ? row_codes<kType>(rows[r], b) : _mm256_setzero_si256();
    RowGroup8& o = out[b];
    transpose8(y, o.codes);
    for (int r = 0; r < 8; ++r) {
      o.d[r] = r < nr ? half[rows[r].d(b)] : 0.0f;
      if constexpr (kType == DType::kQ4_1) o.m[r] = r < nr ? half[rows[r].m(b)] : 0.0f;
    }
  }
}

// Lane r of the result: the contract's value for row r of the group and activation row `act`.
template <DType kType>
__m256 tile_lanes(const RowGroup8* w, int64_t nb, const LaneActBlock* act) {
  static_assert(kType == DType::kQ4_0 || kType == DType::kQ4_1 || kType == DType::kQ5_0);
  const __m256i ones16 = _mm256_set1_epi16(1);
  __m256 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
  [[maybe_unused]] __m256 summs = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const RowGroup8& wb = w[b];
    const LaneActBlock& a = act[b];
    const __m256 d = _mm256_mul_ps(_mm256_load_ps(wb.d), _mm256_set1_ps(a.d));
    if constexpr (kType == DType::kQ4_1) summs = _mm256_fmadd_ps(_mm256_load_ps(wb.m), _mm256_set1_ps(a.s), summs);
    for (int i = 0; i < 8; ++i) {
      const __m256i codes = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb.codes[i]));
      const __m256i y = broadcast32(&a.q[i]);
      __m256i n = _mm256_madd_epi16(_mm256_maddubs_epi16(codes, y), ones16);
      if constexpr (kType == DType::kQ4_0 || kType == DType::kQ5_0) n = _mm256_add_epi32(n, broadcast32(&a.start[i]));
      acc[i] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(n), acc[i]);
    }
  }
  // ggml's reduction, lane by lane: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
  const __m256 r0 = _mm256_add_ps(acc[0], acc[4]);
  const __m256 r1 = _mm256_add_ps(acc[1], acc[5]);
  const __m256 r2 = _mm256_add_ps(acc[2], acc[6]);
  const __m256 r3 = _mm256_add_ps(acc[3], acc[7]);
  __m256 v = _mm256_add_ps(_mm256_add_ps(r0, r2), _mm256_add_ps(r1, r3));
  if constexpr (kType == DType::kQ4_1) v = _mm256_add_ps(v, summs);
  return v;
}

template <DType kType>
void gemm_lanes(const GemmArgs& g) {
  const int64_t nb = g.k / 32;
  LaneScratch& s = lane_scratch();
  if (s.acts.size() < static_cast<size_t>(g.m * nb)) s.acts.resize(static_cast<size_t>(g.m * nb));
  if (s.group.size() < static_cast<size_t>(nb)) s.group.resize(static_cast<size_t>(nb));
  RowGroup8* group = s.group.data();
  pack_lane_acts<kType>(g, nb, s.acts.data());
  // Activation rows per pass over a group (gemm_tiles::token_block).
  const int64_t token_block = gemm_tiles::token_block(nb * static_cast<int64_t>(sizeof(LaneActBlock)));
  for (int64_t t0 = 0; t0 < g.m; t0 += token_block) {
    const int64_t t_end = std::min(g.m, t0 + token_block);
    for (int64_t row0 = g.r0; row0 < g.r1; row0 += 8) {
      const int nr = static_cast<int>(std::min<int64_t>(8, g.r1 - row0));
      unpack_rows8<kType>(g, row0, nr, nb, group);
      for (int64_t t = t0; t < t_end; ++t) store_rows8(g, t, row0, nr, tile_lanes<kType>(group, nb, s.acts.data() + t * nb));
    }
  }
}

// ---- Q8_0 rows in lanes with int16 codes ----
//
// The sign trick costs Q8_0 two extra operations per (8 rows, activation row, lane): vpsignb and vpabsb
// run on the same two ports (FP0/FP1 on Zen 4; 0/1 on Intel) as maddubs, madd and the fma, and those
// five made the tile port-bound at 2.5 cycles per 32 products. Here the weights of a group are widened to
// int16 once per token block and the activations once per call: the lane's four products are two vpmaddwd
// (int16 pairs, exact) and an add (any port), then the contract's cvt (FP2/FP3) and fma: three operations
// on the multiply ports instead of five. The integers are the same four-product sums as ggml's
// maddubs + madd (exact either way), so the result is the vec_dot order bit for bit.
//
// Per (group, block) the codes of lane i are two registers (elements 4i, 4i + 1 and 4i + 2, 4i + 3 of the 8
// rows as int16 pairs); kQ8Tokens activation rows share each codes load, and the 8 lanes are run in passes of
// kQ8Lanes so that the kQ8Tokens x kQ8Lanes accumulators stay in registers. The blocks go in chunks of
// kQ8ChunkBlocks (13 KiB of codes) that stay in L1 while every activation row of the token block passes over
// them (whole groups, 34 KiB at k = 2048, made the two passes evict each other: 35 instead of 41 GMAC/s).
// 1.1B Q8_0 prefill 0.92x -> 1.14x llama-bench on an AVX2-only Zen 4 (BENCHMARKS.md).
constexpr int kQ8Tokens = 2;
constexpr int kQ8Lanes = 4;
constexpr int64_t kQ8ChunkBlocks = 24;

struct alignas(32) RowGroup8Q8 {
  uint32_t codes[16][8];  // [2i + h][row r]: row r's elements 4i + 2h, 4i + 2h + 1 as two int16
  float d[8];
};
static_assert(sizeof(RowGroup8Q8) == 544);

// One activation row's block widened: dword 2i + h holds elements 4i + 2h, 4i + 2h + 1 as two int16.
struct LaneActQ8 {
  uint32_t q[16];
  float d;
};
static_assert(sizeof(LaneActQ8) == 68);

struct Acc8 {
  __m256 v[8];
};

struct LaneScratchQ8 {
  std::vector<LaneActQ8> acts;     // chunk by chunk, [activation row][block] in each (pack_lane_acts_q8)
  std::vector<RowGroup8Q8> group;  // [block] of the current 8 rows
  std::vector<Acc8> acc;           // [activation row of the token block]: the 8 lanes' accumulators
};

LaneScratchQ8& lane_scratch_q8() {
  thread_local LaneScratchQ8 s;
  return s;
}

// Activation rows' blocks chunk by chunk (kQ8ChunkBlocks blocks): chunk c0 / kQ8ChunkBlocks starts at c0 * m, and
// in it row t's n blocks follow row t - 1's, so that a pass of every row over one chunk reads one stream.
void pack_lane_acts_q8(const GemmArgs& g, int64_t nb, LaneActQ8* out) {
  const float* half = scalar::fp16_table();
  for (int64_t t = 0; t < g.m; ++t) {
    const auto* a = reinterpret_cast<const BlockQ8_0*>(g.act + static_cast<size_t>(t) * g.act_stride);
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t c0 = b / kQ8ChunkBlocks * kQ8ChunkBlocks;
      LaneActQ8& dst = out[c0 * g.m + t * std::min(kQ8ChunkBlocks, nb - c0) + (b - c0)];
      const __m256i q = load32(a[b].qs);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst.q), _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst.q + 8), _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)));
      dst.d = half[a[b].d];
    }
  }
}

void unpack_rows8_q8(const GemmArgs& g, int64_t row0, int nr, int64_t nb, RowGroup8Q8* out) {
  const float* half = scalar::fp16_table();
  gemm_tiles::RowBlocks<BlockQ8_0> rows[8];
  for (int r = 0; r < nr; ++r) rows[r] = gemm_tiles::row_blocks<BlockQ8_0>(g, row0 + r);
  for (int64_t b = 0; b < nb; ++b) {
    __m256i lo[8], hi[8];
    for (int r = 0; r < 8; ++r) {
      const __m256i q = r < nr ? load32(rows[r].qs(b)) : _mm256_setzero_si256();
      lo[r] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
      hi[r] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
    }
    RowGroup8Q8& o = out[b];
    transpose8(lo, o.codes);
    transpose8(hi, o.codes + 8);
    for (int r = 0; r < 8; ++r) o.d[r] = r < nr ? half[rows[r].d(b)] : 0.0f;
  }
}

// One lane's step: n = the lane's four-product sums of the 8 rows (two madds of int16 pairs), acc += d * n.
inline __m256 q8_lane_step(__m256i c0, __m256i c1, const uint32_t* q, __m256 d, __m256 acc) {
  const __m256i n = _mm256_add_epi32(_mm256_madd_epi16(c0, broadcast32(q)), _mm256_madd_epi16(c1, broadcast32(q + 1)));
  return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(n), acc);
}

// Continues acc[t][kLane0 + i] (lane r: row r of the group) for activation rows act + t * act_rows_apart, t < T,
// and the contract's lanes kLane0 + i, i < kQ8Lanes, over blocks w[0 .. n).
template <int T, int kLane0>
void tile_lanes_q8(const RowGroup8Q8* w, int64_t n, const LaneActQ8* act, int64_t act_rows_apart, __m256 (*acc)[8]) {
  static_assert(T >= 1 && T <= kQ8Tokens && kQ8Lanes == 4);
  constexpr int j0 = 2 * kLane0;
  __m256 a00 = acc[0][kLane0], a01 = acc[0][kLane0 + 1], a02 = acc[0][kLane0 + 2], a03 = acc[0][kLane0 + 3];
  [[maybe_unused]] __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
  if constexpr (T > 1) a10 = acc[1][kLane0], a11 = acc[1][kLane0 + 1], a12 = acc[1][kLane0 + 2], a13 = acc[1][kLane0 + 3];
  const LaneActQ8* x0 = act;
  const LaneActQ8* x1 = act + (T > 1 ? act_rows_apart : 0);
  for (int64_t b = 0; b < n; ++b, ++w, ++x0, ++x1) {
    const __m256 dw = _mm256_load_ps(w->d);
    const __m256 d0 = _mm256_mul_ps(dw, _mm256_broadcast_ss(&x0->d));
    [[maybe_unused]] const __m256 d1 = T > 1 ? _mm256_mul_ps(dw, _mm256_broadcast_ss(&x1->d)) : d0;
    const auto* c = reinterpret_cast<const __m256i*>(w->codes[j0]);
    auto lane = [&](int i, __m256& acc0, __m256& acc1) {
      __m256i c0 = _mm256_load_si256(c + 2 * i), c1 = _mm256_load_si256(c + 2 * i + 1);
      asm("" : "+x"(c0), "+x"(c1));  // in registers: both activation rows read them
      acc0 = q8_lane_step(c0, c1, x0->q + j0 + 2 * i, d0, acc0);
      if constexpr (T > 1) acc1 = q8_lane_step(c0, c1, x1->q + j0 + 2 * i, d1, acc1);
    };
    lane(0, a00, a10);
    lane(1, a01, a11);
    lane(2, a02, a12);
    lane(3, a03, a13);
  }
  acc[0][kLane0] = a00, acc[0][kLane0 + 1] = a01, acc[0][kLane0 + 2] = a02, acc[0][kLane0 + 3] = a03;
  if constexpr (T > 1) acc[1][kLane0] = a10, acc[1][kLane0 + 1] = a11, acc[1][kLane0 + 2] = a12, acc[1][kLane0 + 3] = a13;
}

void gemm_lanes_q8_0(const GemmArgs& g) {
  const int64_t nb = g.k / 32;
  LaneScratchQ8& s = lane_scratch_q8();
  if (s.acts.size() < static_cast<size_t>(g.m * nb)) s.acts.resize(static_cast<size_t>(g.m * nb));
  if (s.group.size() < static_cast<size_t>(nb)) s.group.resize(static_cast<size_t>(nb));
  pack_lane_acts_q8(g, nb, s.acts.data());
  // Activation rows per unpacking of a group (gemm_tiles::token_block).
  const int64_t token_block = gemm_tiles::token_block(nb * static_cast<int64_t>(sizeof(LaneActQ8)));
  if (s.acc.size() < static_cast<size_t>(token_block)) s.acc.resize(static_cast<size_t>(token_block));
  for (int64_t t0 = 0; t0 < g.m; t0 += token_block) {
    const int64_t t_end = std::min(g.m, t0 + token_block);
    for (int64_t row0 = g.r0; row0 < g.r1; row0 += 8) {
      const int nr = static_cast<int>(std::min<int64_t>(8, g.r1 - row0));
      unpack_rows8_q8(g, row0, nr, nb, s.group.data());
      // The group's blocks in chunks whose codes (544 bytes a block) stay in L1 while every activation row of the
      // token block passes over them; the accumulators wait in memory between chunks (the order per lane is
      // unchanged: chunk after chunk, block after block).
      std::fill(s.acc.begin(), s.acc.begin() + (t_end - t0), Acc8{});
      for (int64_t c0 = 0; c0 < nb; c0 += kQ8ChunkBlocks) {
        const int64_t n = std::min<int64_t>(kQ8ChunkBlocks, nb - c0);
        const RowGroup8Q8* w = s.group.data() + c0;
        for (int64_t t = t0; t < t_end; t += kQ8Tokens) {
          const LaneActQ8* act = s.acts.data() + c0 * g.m + t * n;
          __m256(*acc)[8] = &s.acc[static_cast<size_t>(t - t0)].v;
          if (t + 1 < t_end) {
            tile_lanes_q8<2, 0>(w, n, act, n, acc);
            tile_lanes_q8<2, 4>(w, n, act, n, acc);
          } else {
            tile_lanes_q8<1, 0>(w, n, act, n, acc);
            tile_lanes_q8<1, 4>(w, n, act, n, acc);
          }
        }
      }
      for (int64_t t = t0; t < t_end; ++t) {
        // ggml's reduction, lane by lane: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
        const __m256* a = s.acc[static_cast<size_t>(t - t0)].v;
        const __m256 v = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                                       _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])));
        store_rows8(g, t, row0, nr, v);
      }
    }
  }
}

// ---- Q4_0 in MatmulOrder::kRepacked (inferd/kernels/cpu.h) --------------------------------------
//
// The rows-in-lanes tile of the order llama.cpp's repacked Q4_0 kernels sum in: per block one exact integer
// dot per (row, activation row) and one fma. The 8 rows' codes (RowGroup8, as gemm_lanes unpacks them: dword
// i of lane r holds row r's codes 4i..4i+3, 0..15) meet each activation dword by maddubs; the eight int16
// pair sums of a block add up in int16 (|sum| <= 8 * 2 * 15 * 127 < 32768), one madd makes the lane's int32,
// the block's -8 * sum(a) joins it, then cvt and the fma. Per (8 rows, activation row, block) that is 8
// maddubs + 8 adds + 5 vector operations, against 8 x (maddubs, madd, add, cvt, fma) in the vec_dot order;
// kRepackedTokens activation rows share each codes load. Equal bit for bit to scalar.cpp's dot_q4_0_repacked.

struct alignas(8) RepackedActBlock {
  int32_t q[8];   // the 32 quants as dwords (elements 4i..4i+3)
  int32_t start;  // -8 * the sum of the 32 quants
  float d;        // the block's scale
};
static_assert(sizeof(RepackedActBlock) == 40);

// Activation rows per tile: 6 int16 sums + 6 accumulators + codes, a broadcast and the ones fill 15 of the 16
// ymm registers (1.1B Q4_0 prefill 78-90 -> 87-100 tok/s against 4, alternated; GEMM +3-6% single thread).
constexpr int kRepackedTokens = 6;

// out[t] lane r = the order's value for row r of the group and activation row t < T. The T sums and
// accumulators are named registers, not arrays, and each sum is pinned after every step: left free, GCC 12
// regrouped the integer adds into a tree over all 8 x T products and kept them on the stack.
template <int T>
void tile_repacked(const RowGroup8* w, int64_t nb, const RepackedActBlock* act, int64_t act_rows_apart,
                   __m256 out[]) {
  static_assert(T >= 1 && T <= 6);
  const __m256i ones16 = _mm256_set1_epi16(1);
  const RepackedActBlock* a0 = act;
  const RepackedActBlock* a1 = act + (T > 1 ? 1 : 0) * act_rows_apart;
  const RepackedActBlock* a2 = act + (T > 2 ? 2 : 0) * act_rows_apart;
  const RepackedActBlock* a3 = act + (T > 3 ? 3 : 0) * act_rows_apart;
  const RepackedActBlock* a4 = act + (T > 4 ? 4 : 0) * act_rows_apart;
  const RepackedActBlock* a5 = act + (T > 5 ? 5 : 0) * act_rows_apart;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0, acc4 = acc0, acc5 = acc0;
  auto finish = [&](__m256i sum, const RepackedActBlock& a, __m256 dw, __m256 acc) {
    const __m256i n = _mm256_add_epi32(_mm256_madd_epi16(sum, ones16), broadcast32(&a.start));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(n), _mm256_mul_ps(dw, _mm256_set1_ps(a.d)), acc);
  };
  for (int64_t b = 0; b < nb; ++b) {
    const RowGroup8& wb = w[b];
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0;
    for (int i = 0; i < 8; ++i) {
      const __m256i codes = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb.codes[i]));
      s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(codes, broadcast32(&a0[b].q[i])));
      if constexpr (T > 1) s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(codes, broadcast32(&a1[b].q[i])));
      if constexpr (T > 2) s2 = _mm256_add_epi16(s2, _mm256_maddubs_epi16(codes, broadcast32(&a2[b].q[i])));
      if constexpr (T > 3) s3 = _mm256_add_epi16(s3, _mm256_maddubs_epi16(codes, broadcast32(&a3[b].q[i])));
      if constexpr (T > 4) s4 = _mm256_add_epi16(s4, _mm256_maddubs_epi16(codes, broadcast32(&a4[b].q[i])));
      if constexpr (T > 5) s5 = _mm256_add_epi16(s5, _mm256_maddubs_epi16(codes, broadcast32(&a5[b].q[i])));
      // One running sum per activation row, step by step (an empty asm the compiler cannot look through).
      asm("" : "+x"(s0), "+x"(s1), "+x"(s2), "+x"(s3), "+x"(s4), "+x"(s5));
    }
    const __m256 dw = _mm256_load_ps(wb.d);
    acc0 = finish(s0, a0[b], dw, acc0);
    if constexpr (T > 1) acc1 = finish(s1, a1[b], dw, acc1);
    if constexpr (T > 2) acc2 = finish(s2, a2[b], dw, acc2);
    if constexpr (T > 3) acc3 = finish(s3, a3[b], dw, acc3);
    if constexpr (T > 4) acc4 = finish(s4, a4[b], dw, acc4);
    if constexpr (T > 5) acc5 = finish(s5, a5[b], dw, acc5);
  }
  out[0] = acc0;
  if constexpr (T > 1) out[1] = acc1;
  if constexpr (T > 2) out[2] = acc2;
  if constexpr (T > 3) out[3] = acc3;
  if constexpr (T > 4) out[4] = acc4;
  if constexpr (T > 5) out[5] = acc5;
}


// ---- IQ4_NL in MatmulOrder::kRepacked ------------------------------------------------------------
//
// llama.cpp's iq4_nl_8x8 order (q4_0_8x8's kernels with the non-linear values; scalar.cpp's dot_iq4_nl_repacked):
// per block the exact integer dot and one fma. Rows in lanes as Q4_0's (gemm_block32_repacked), the signed values in the
// codes; they reach 127 in magnitude, so each activation dword's maddubs pair sums (ggml's sign trick) become
// int32 at once by a madd (two of them would not fit int16): 5 operations per activation dword and 8 rows.

constexpr int kRepackedNlTokens = 4;

template <int T>
void tile_repacked_iq4_nl(const RowGroup8* w, int64_t nb, const RepackedActBlock* act, int64_t act_rows_apart,
                          __m256 out[]) {
  static_assert(T >= 1 && T <= kRepackedNlTokens);
  const __m256i ones16 = _mm256_set1_epi16(1);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const RowGroup8& wb = w[b];
    __m256i n[T];
    for (int t = 0; t < T; ++t) n[t] = _mm256_setzero_si256();
    for (int i = 0; i < 8; ++i) {
      const __m256i values = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb.codes[i]));
      const __m256i magnitudes = _mm256_abs_epi8(values);
      for (int t = 0; t < T; ++t) {
        const __m256i y = _mm256_sign_epi8(broadcast32(&act[t * act_rows_apart + b].q[i]), values);
        n[t] = _mm256_add_epi32(n[t], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitudes, y), ones16));
      }
    }
    const __m256 dw = _mm256_load_ps(wb.d);
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(n[t]), _mm256_mul_ps(dw, _mm256_set1_ps(act[t * act_rows_apart + b].d)),
                               acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) out[t] = acc[t];
}

template <DType kType>
void gemm_block32_repacked(const GemmArgs& g) {
  static_assert(kType == DType::kQ4_0 || kType == DType::kIQ4_NL);
  thread_local gemm_tiles::Block32Scratch<RepackedActBlock, RowGroup8> s;
  const float* half = scalar::fp16_table();
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  const bool work = s.prepare(g, kType, [&](const BlockQ8_0& a, RepackedActBlock& dst) {
    const __m256i q = load32(a.qs);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst.q), q);
    const __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sums);
    int32_t sum = 0;
    for (int32_t v : lanes) sum += v;
    dst.start = -8 * sum;  // Q4_0's -8 (IQ4_NL's values are signed already: unused)
    dst.d = half[a.d];
  });
  if (!work) return;
  const int64_t nb = g.k / 32;
  // Activation rows per pass over a group (gemm_tiles::token_block).
  const int64_t token_block = gemm_tiles::token_block(nb * static_cast<int64_t>(sizeof(RepackedActBlock)));
  constexpr int kTokens = kType == DType::kQ4_0 ? kRepackedTokens : kRepackedNlTokens;
  __m256 res[kTokens];
  gemm_tiles::repacked_walk<8>(
      g, token_block, kTokens, false, [&](int64_t row0, int nr) { unpack_rows8<kType>(g, row0, nr, nb, s.group.data()); },
      [&](int64_t t, int nt, bool, int64_t row0, int nr) {
        const RepackedActBlock* act = s.acts.data() + t * nb;
        gemm_tiles::with_count<kTokens>(nt, [&](auto n) {
          if constexpr (kType == DType::kQ4_0) {
            tile_repacked<n>(s.group.data(), nb, act, nb, res);
          } else {
            tile_repacked_iq4_nl<n>(s.group.data(), nb, act, nb, res);
          }
        });
        for (int i = 0; i < nt; ++i) store_rows8(g, t + i, row0, nr, res[i]);
      });
}

// ---- Q4_K in MatmulOrder::kRepacked ---------------------------------------------------------------
//
// llama.cpp's repacked q4_K_8x8 orders (inferd/kernels/cpu.h): its GEMV's for the last m % 4 activation rows,
// per super-block the exact integers n = sum_s sc_s * isum_s and m = sum_s mn_s * (bsum_2s + bsum_2s+1),
// acc = fma(float(n), d_w * d_a, acc), accm = fma(float(m), dmin_w * d_a, accm); its GEMM's for the rows before
// them, the same per pair of sub-blocks (four steps per super-block); the result acc - accm. Rows in lanes as
// Q4_0's tile above: lane r
// of codes[s][i] holds row r's codes of elements 32s + 4i .. + 3 (0..15); per sub-block the eight maddubs
// with the activation's dwords add up in int16 (16 products of |value| <= 15 * 127: < 32768) and one madd
// with the sub-block scales (int16 lanes 2r and 2r + 1 both hold row r's sc_s) makes lane r's sc_s * isum_s.
// Per (8 rows, activation row, sub-block): 8 maddubs + 8 adds + madd + add, against 8 x (maddubs, madd, add)
// in the vec_dot order's tile. The min term: per super-block four madds of the 8 rows' mins with the
// activation's sub-block sums. Equal bit for bit to gemm.cpp's scalar definition (and its GEMV rows to
// scalar.cpp's dot_q4_k_repacked).

// One super-block of 8 rows, unpacked. Rows past the matrix are zero.
struct alignas(32) RowGroup8K {
  static constexpr int kRows = 8;
  uint32_t codes[8][8][8];  // [sub-block][dword][row]
  int16_t scales[8][16];    // [sub-block]: sc of row r in int16 lanes 2r and 2r + 1 (for madd)
  int16_t mins[4][16];      // [pair j]: mn_2j and mn_2j+1 of row r in int16 lanes 2r and 2r + 1
  float d[8];
  float dmin[8];

  void set_scale(int s, int r, int sc) { scales[s][2 * r] = scales[s][2 * r + 1] = static_cast<int16_t>(sc); }
};
static_assert(sizeof(RowGroup8K) == 2496);

using gemm_tiles::KPairSums;

// Activation rows per tile (their int16 sums and int32 n fill 12 ymm beside the codes, scales and a broadcast).
constexpr int kRepackedKTokens = 6;

// out[t] lane r = the order's value for row r of the group and activation row t < T (act[t]: the row's Q8_K
// blocks, pairs[t] its KPairSums); kPairs: the GEMM's steps per pair of sub-blocks, else the GEMV's per block.
template <int T, bool kPairs>
void tile_q4_k_repacked(const RowGroup8K* w, int64_t nb, const BlockQ8_K* const* act, const KPairSums* const* pairs,
                        __m256 out[]) {
  static_assert(T >= 1 && T <= kRepackedKTokens);
  alignas(32) float acc[T][8] = {}, accm[T][8] = {};
  // Named registers, not arrays (arrays of sums were kept on the stack), each int16 sum pinned after every
  // step as in tile_repacked.
  const int8_t* q0 = act[0]->qs;
  const int8_t* q1 = act[T > 1 ? 1 : 0]->qs;
  const int8_t* q2 = act[T > 2 ? 2 : 0]->qs;
  const int8_t* q3 = act[T > 3 ? 3 : 0]->qs;
  const int8_t* q4 = act[T > 4 ? 4 : 0]->qs;
  const int8_t* q5 = act[T > 5 ? 5 : 0]->qs;
  auto bq = [](const int8_t* q, int64_t off) { return broadcast32(reinterpret_cast<const int32_t*>(q + off)); };
  for (int64_t b = 0; b < nb; ++b) {
    const RowGroup8K& wb = w[b];
    const int64_t base = b * static_cast<int64_t>(sizeof(BlockQ8_K));
    __m256i n0 = _mm256_setzero_si256(), n1 = n0, n2 = n0, n3 = n0, n4 = n0, n5 = n0;
    auto finish = [&](int t, __m256i& n, int j) {  // kPairs: pair j's steps; else the block's
      const __m256 d = _mm256_load_ps(wb.d), dmin = _mm256_load_ps(wb.dmin);
      const int32_t* p = reinterpret_cast<const int32_t*>(pairs[t][b].v);
      __m256i m;
      if (kPairs) {
        m = _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(wb.mins[j])), broadcast32(p + j));
      } else {
        m = _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(wb.mins[0])), broadcast32(p));
        for (int jj = 1; jj < 4; ++jj) {
          m = _mm256_add_epi32(
              m, _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(wb.mins[jj])), broadcast32(p + jj)));
        }
      }
      const __m256 da = _mm256_set1_ps(act[t][b].d);
      _mm256_store_ps(acc[t], _mm256_fmadd_ps(_mm256_cvtepi32_ps(n), _mm256_mul_ps(d, da), _mm256_load_ps(acc[t])));
      _mm256_store_ps(accm[t], _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dmin, da), _mm256_load_ps(accm[t])));
      n = _mm256_setzero_si256();
    };
    for (int s = 0; s < 8; ++s) {
      const int64_t off = base + 32 * s;
      __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0;
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        const __m256i codes = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb.codes[s][i]));
        const int64_t o = off + 4 * i;
        s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(codes, bq(q0, o)));
        if constexpr (T > 1) s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(codes, bq(q1, o)));
        if constexpr (T > 2) s2 = _mm256_add_epi16(s2, _mm256_maddubs_epi16(codes, bq(q2, o)));
        if constexpr (T > 3) s3 = _mm256_add_epi16(s3, _mm256_maddubs_epi16(codes, bq(q3, o)));
        if constexpr (T > 4) s4 = _mm256_add_epi16(s4, _mm256_maddubs_epi16(codes, bq(q4, o)));
        if constexpr (T > 5) s5 = _mm256_add_epi16(s5, _mm256_maddubs_epi16(codes, bq(q5, o)));
        asm("" : "+x"(s0), "+x"(s1), "+x"(s2), "+x"(s3), "+x"(s4), "+x"(s5));
      }
      const __m256i sc = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb.scales[s]));
      n0 = _mm256_add_epi32(n0, _mm256_madd_epi16(s0, sc));
      if constexpr (T > 1) n1 = _mm256_add_epi32(n1, _mm256_madd_epi16(s1, sc));
      if constexpr (T > 2) n2 = _mm256_add_epi32(n2, _mm256_madd_epi16(s2, sc));
      if constexpr (T > 3) n3 = _mm256_add_epi32(n3, _mm256_madd_epi16(s3, sc));
      if constexpr (T > 4) n4 = _mm256_add_epi32(n4, _mm256_madd_epi16(s4, sc));
      if constexpr (T > 5) n5 = _mm256_add_epi32(n5, _mm256_madd_epi16(s5, sc));
      if (kPairs && s % 2 == 1) {
        // The pair's steps (llama.cpp's GEMM: the quant sums' fma and the min term's).
        finish(0, n0, s / 2);
        if constexpr (T > 1) finish(1, n1, s / 2);
        if constexpr (T > 2) finish(2, n2, s / 2);
        if constexpr (T > 3) finish(3, n3, s / 2);
        if constexpr (T > 4) finish(4, n4, s / 2);
        if constexpr (T > 5) finish(5, n5, s / 2);
      }
    }
    if (!kPairs) {
      finish(0, n0, 0);
      if constexpr (T > 1) finish(1, n1, 0);
      if constexpr (T > 2) finish(2, n2, 0);
      if constexpr (T > 3) finish(3, n3, 0);
      if constexpr (T > 4) finish(4, n4, 0);
      if constexpr (T > 5) finish(5, n5, 0);
    }
  }
  for (int t = 0; t < T; ++t) out[t] = _mm256_sub_ps(_mm256_load_ps(acc[t]), _mm256_load_ps(accm[t]));
}

void gemm_q4_k_repacked(const GemmArgs& g) {
  thread_local gemm_tiles::RepackedKScratch<RowGroup8K> s;
  if (!s.prepare(g)) return;
  const int64_t nb = g.k / kQK_K;
  auto act_row = [&](int64_t t) { return s.act_row(g, t); };
  // Activation rows per pass over a group (gemm_tiles::token_block).
  const int64_t token_block = gemm_tiles::token_block(nb * static_cast<int64_t>(sizeof(BlockQ8_K)));
  __m256 res[kRepackedKTokens];
  gemm_tiles::repacked_walk<8>(
      g, token_block, kRepackedKTokens, true, [&](int64_t row0, int nr) { gemm_tiles::unpack_q4_k_rows(g, row0, nr, nb, s.group.data()); },
      [&](int64_t t, int nt, bool gemm_row, int64_t row0, int nr) {
        const BlockQ8_K* acts[kRepackedKTokens] = {};
        const KPairSums* tile_pairs[kRepackedKTokens] = {};
        for (int i = 0; i < nt; ++i) {
          acts[i] = act_row(t + i);
          tile_pairs[i] = s.pairs.data() + (t + i) * nb;
        }
        if (gemm_row) {
          gemm_tiles::with_count<kRepackedKTokens>(
              nt, [&](auto n) { tile_q4_k_repacked<n, true>(s.group.data(), nb, acts, tile_pairs, res); });
        } else {  // at most 3 rows: the GEMV's
          gemm_tiles::with_count<3>(nt, [&](auto n) { tile_q4_k_repacked<n, false>(s.group.data(), nb, acts, tile_pairs, res); });
        }
        for (int i = 0; i < nt; ++i) store_rows8(g, t + i, row0, nr, res[i]);
      });
}

template <DType kType>
void gemm(const GemmArgs& g) {
  INFERD_ASSERT(g.k % 32 == 0, "k must be a multiple of 32");
  INFERD_ASSERT(g.layout == WeightLayout::kRows || interleavable(kType), "%s has no interleaved layout", dtype_name(kType));
  INFERD_ASSERT(g.layout == WeightLayout::kRows || g.r0 % kInterleaveRows == 0, "an interleaved GEMM starts at a group");
  if (g.m <= 0 || g.r1 <= g.r0) return;
  if constexpr (kType != DType::kIQ4_NL) {
    // Below 8 activation rows the unpacking of each 8-row group costs more than it saves (measured).
    if (g.m >= 8) {
      if constexpr (kType == DType::kQ8_0) {
        return gemm_lanes_q8_0(g);
      } else {
        return gemm_lanes<kType>(g);
      }
    }
  }
  const int64_t nb = g.k / 32;
  const int64_t npairs = (g.m + 1) / 2;
  Scratch& s = scratch();
  const size_t act_blocks = static_cast<size_t>(2 * npairs * nb);
  if (s.acts.size() < act_blocks) s.acts.resize(act_blocks);
  const size_t scale_floats = static_cast<size_t>((2 * npairs + kCols - 1) / kCols * nb * 8);
  if (s.act_scales.size() < scale_floats) s.act_scales.resize(scale_floats);
  pack_acts<kType>(g, nb, 2 * npairs, s.acts.data(), s.act_scales.data());
  // The summs step loads 4 tokens from a tile's first row: pad so that the load stays inside.
  const int64_t m_pad = (g.m + 3) / 4 * 4 + 4;
  if constexpr (kType == DType::kQ4_1) {
    if (s.act_sums.size() < static_cast<size_t>(nb * m_pad)) s.act_sums.resize(static_cast<size_t>(nb * m_pad));
    gemm_tiles::pack_act_sums(g, nb, m_pad, s.act_sums.data());
  }
  alignas(32) float summs[kRows][kCols];
  gemm_tiles::walk<kRows, kPairs>(g, npairs, [&](int64_t r, int nr, int64_t p0, int np, float (*res)[kCols]) {
    const TileIo io{&g,
                    r,
                    s.acts.data() + 2 * p0 * nb,
                    s.act_scales.data() + p0 / kPairs * nb * 8,
                    nb,
                    kType == DType::kQ4_1 ? s.act_sums.data() + 2 * p0 : nullptr,
                    m_pad,
                    res,
                    summs};
    gemm_tiles::TileTable<TileOf<kType>, kRows, kPairs>::kTable[nr - 1][np - 1](io);
    if constexpr (kType == DType::kQ4_1) gemm_tiles::add_min_terms(nr, 2 * np, summs, res);
  });
}

}  // namespace

GemmFn repacked_kernel(DType type) {
  switch (type) {
    case DType::kQ4_0:
      return &gemm_block32_repacked<DType::kQ4_0>;
    case DType::kIQ4_NL:
      return &gemm_block32_repacked<DType::kIQ4_NL>;
    case DType::kQ4_K:
      return &gemm_q4_k_repacked;
    default:
      return nullptr;
  }
}

GemmFn kernel(DType type) {
  switch (type) {
    case DType::kQ4_0:
      return &gemm<DType::kQ4_0>;
    case DType::kQ4_1:
      return &gemm<DType::kQ4_1>;
    case DType::kQ5_0:
      return &gemm<DType::kQ5_0>;
    case DType::kQ8_0:
      return &gemm<DType::kQ8_0>;
    case DType::kIQ4_NL:
      return &gemm<DType::kIQ4_NL>;
    default:
      return nullptr;
  }
}

}  // namespace inferd::kernels::gemm_avx2
