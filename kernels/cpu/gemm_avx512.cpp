// AVX-512 VNNI GEMM for Q4_0, Q4_1, Q5_0 and Q8_0 weights (see inferd/kernels/gemm.h for the contract). Q8_0
// has its own tile with weight rows in lanes (at the end of the file); the others share the pair tile below.
//
// Layout of the work. The activation rows are first packed, once per call, in pairs: for each pair
// of activation rows and each 32-element block a PairBlock holds both rows' 32 quants side by side
// (one zmm), the integer start value of each of the 16 int32 lanes, and each lane's activation
// scale. A weight block is decoded once per tile into one zmm holding the block twice, so that one
// vpdpbusd yields the 8 lane sums of the contract for two activation rows at once (lanes 0..7 row
// t, lanes 8..15 row t + 1). A tile is kRows weight rows x kPairs activation pairs of such
// accumulators, run over all blocks of k.
//
// Integer tricks (all exact):
//  - vpdpbusd multiplies unsigned weight bytes by signed activation bytes. Q4_0 weights are used as
//    raw nibbles q (not q - 8); the start value of each lane (-8 times the lane's activation sum)
//    removes the offset again.
//  - The two nibbles of a 4-bit block are separated by one AND with 0x0F / 0xF0 per 128-bit lane,
//    so elements 16..31 enter as 16 q. Their lanes' integer sums are 16 times too large and their
//    activation scale is stored divided by 16: (s / 16) * (16 n) == s * n exactly and s / 16 is a
//    normal float rounded like s, so the fused multiply-add is bit-identical.
//  - Q5_0's codes are nibble + 16 * fifth bit (0..31, offset 16 in the start value): the high nibbles
//    are shifted down (16 * 31 would not fit a byte), and the fifth bits are one masked add of 16 with
//    the block's 32-bit qh, twice, as the byte mask.
// Float steps per lane are exactly the contract's: scale = d_w * d_a (fp32), acc = fma(scale,
// float(n), acc), block by block.
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

namespace inferd::kernels::gemm_avx512 {
namespace {

struct alignas(64) PairBlock {
  int8_t a[64];       // quants of activation rows t (bytes 0..31) and t + 1 (32..63)
  int32_t start[16];  // initial value of each int32 lane before vpdpbusd
  float d[16];        // activation scale of each lane (divided by 16 on high-nibble lanes)
};
static_assert(sizeof(PairBlock) == 192);

// Weight rows per tile and activation pairs per tile (the register tile is kRows x kPairs zmm).
constexpr int kRows = 4;
constexpr int kPairs = 4;
// Prefetch distance along the weight rows (see x86_kernels.inc).
constexpr int kPrefetchBytes = 4096;

struct Scratch {
  std::vector<PairBlock> pairs;  // [pair][block]
  std::vector<float> act_sums;   // Q4_1: s_a of [block][token], tokens padded to a multiple of 8
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

using gemm_tiles::Traits;

template <DType kType>
void pack_pairs(const GemmArgs& g, int64_t nb, int64_t npairs, PairBlock* out) {
  using ABlock = typename Traits<kType>::ABlock;
  const float* half = scalar::fp16_table();
  // Q4_0 and Q4_1 take elements 16..31 as 16 times their nibble (see the top of the file).
  constexpr bool kTimes16 = kType == DType::kQ4_0 || kType == DType::kQ4_1;
  // Per-lane multipliers of the activation sums and of the scales.
  const __m512i start_mul = kType == DType::kQ5_0 ? _mm512_set1_epi32(-16)
                                                  : _mm512_setr_epi32(-8, -8, -8, -8, -128, -128, -128, -128,
                                                                      -8, -8, -8, -8, -128, -128, -128, -128);
  const __m512 d_mul = kTimes16 ? _mm512_setr_ps(1, 1, 1, 1, 0.0625f, 0.0625f, 0.0625f, 0.0625f, 1, 1, 1, 1,
                                                 0.0625f, 0.0625f, 0.0625f, 0.0625f)
                                : _mm512_set1_ps(1.0f);
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t p = 0; p < npairs; ++p) {
    const int64_t t0 = 2 * p;
    const int64_t t1 = std::min(t0 + 1, g.m - 1);  // an odd last row is paired with itself
    const auto* a0 = reinterpret_cast<const ABlock*>(g.act + static_cast<size_t>(t0) * g.act_stride);
    const auto* a1 = reinterpret_cast<const ABlock*>(g.act + static_cast<size_t>(t1) * g.act_stride);
    PairBlock* dst = out + p * nb;
    for (int64_t b = 0; b < nb; ++b) {
      const __m512i q = _mm512_inserti64x4(
          _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a0[b].qs))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a1[b].qs)), 1);
      _mm512_store_si512(dst[b].a, q);
      if constexpr (kType == DType::kQ4_1) {
        _mm512_store_si512(dst[b].start, _mm512_setzero_si512());
      } else {
        const __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, q);
        _mm512_store_si512(dst[b].start, _mm512_mullo_epi32(sums, start_mul));
      }
      const __m512 d = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(half[a0[b].d]), _mm512_set1_ps(half[a1[b].d]));
      _mm512_store_ps(dst[b].d, _mm512_mul_ps(d, d_mul));
    }
  }
}

// One tile's inputs and outputs. Row r of the tile is weight row row0 + r of g's matrix (either layout);
// pairs and act_sums start at the tile's first activation pair / row.
struct TileIo {
  const GemmArgs* g;
  int64_t row0;
  const PairBlock* pairs;  // [pair][block], nb blocks per pair
  int64_t nb;
  const float* act_sums;  // Q4_1: s_a as [block][token], m_pad tokens per block
  int64_t m_pad;
  float (*res)[2 * kPairs];    // [row][activation row]: the reduced lane sums
  float (*summs)[2 * kPairs];  // Q4_1: [row][activation row]: the summs of the contract
};

// The register tile: R weight rows x P activation pairs over all nb blocks.
template <DType kType, int R, int P>
void tile(const TileIo& io) {
  using WBlock = typename Traits<kType>::WBlock;
  const float* half = scalar::fp16_table();
  const int64_t nb = io.nb;
  const PairBlock* pairs = io.pairs;
  gemm_tiles::RowBlocks<WBlock> rows[R];
  for (int r = 0; r < R; ++r) rows[r] = gemm_tiles::row_blocks<WBlock>(*io.g, io.row0 + r);
  [[maybe_unused]] __m256 summs[R];
  if constexpr (kType == DType::kQ4_1) {
    for (int r = 0; r < R; ++r) summs[r] = _mm256_setzero_ps();
  }
  const __m512i nibble_mask = _mm512_setr_epi64(0x0F0F0F0F0F0F0F0F, 0x0F0F0F0F0F0F0F0F, 0xF0F0F0F0F0F0F0F0,
                                                0xF0F0F0F0F0F0F0F0, 0x0F0F0F0F0F0F0F0F, 0x0F0F0F0F0F0F0F0F,
                                                0xF0F0F0F0F0F0F0F0, 0xF0F0F0F0F0F0F0F0);
  [[maybe_unused]] const __m512i high_shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
  [[maybe_unused]] const __m512i low4 = _mm512_set1_epi8(0x0F);
  [[maybe_unused]] const __m512i sixteen = _mm512_set1_epi8(16);
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m512i wq[R];
    __m512 dw[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* qs = rows[r].qs(b);
      // The first activation tile over a chunk streams its weights from memory (later ones find
      // them in L2): ask for them ahead, as the decode GEMV does.
      _mm_prefetch(reinterpret_cast<const char*>(qs) + kPrefetchBytes, _MM_HINT_T0);
      if constexpr (kType == DType::kQ5_0) {
        // 128-bit lanes 0 and 2: elements 0..15, lanes 1 and 3: elements 16..31, each + 16 where bit i of qh.
        const __m512i both = _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
        const uint64_t qh = rows[r].qh(b);
        wq[r] = _mm512_and_si512(_mm512_srlv_epi64(both, high_shift), low4);
        wq[r] = _mm512_mask_add_epi8(wq[r], _cvtu64_mask64(qh | qh << 32), wq[r], sixteen);
      } else {
        wq[r] = _mm512_and_si512(
            _mm512_maskz_broadcast_i32x4(0xFFFF, rows[r].qs16(b)), nibble_mask);
      }
      dw[r] = _mm512_set1_ps(half[rows[r].d(b)]);
    }
    if constexpr (kType == DType::kQ4_1) {
      static_assert(2 * kPairs == 8);
      const __m256 sa = _mm256_loadu_ps(io.act_sums + b * io.m_pad);
      for (int r = 0; r < R; ++r) summs[r] = _mm256_fmadd_ps(_mm256_set1_ps(half[rows[r].m(b)]), sa, summs[r]);
    }
    for (int p = 0; p < P; ++p) {
      const PairBlock& pb = pairs[p * nb + b];
      const __m512i aq = _mm512_load_si512(pb.a);
      const __m512 da = _mm512_load_ps(pb.d);
      for (int r = 0; r < R; ++r) {
        const __m512i n = _mm512_dpbusd_epi32(_mm512_load_si512(pb.start), wq[r], aq);
        acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(dw[r], da), _mm512_cvtepi32_ps(n), acc[r][p]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) {
      io.res[r][2 * p] = gemm_tiles::reduce8(_mm512_castps512_ps256(acc[r][p]));
      io.res[r][2 * p + 1] = gemm_tiles::reduce8(_mm512_maskz_extractf32x8_ps(0xFF, acc[r][p], 1));
    }
    if constexpr (kType == DType::kQ4_1) _mm256_storeu_ps(io.summs[r], summs[r]);
  }
}

template <DType kType>
struct TileOf {
  template <int R, int P>
  static void fn(const TileIo& io) {
    tile<kType, R, P>(io);
  }
};

template <DType kType>
void gemm(const GemmArgs& g) {
  INFERD_ASSERT(g.k % 32 == 0, "k must be a multiple of 32");
  INFERD_ASSERT(g.layout == WeightLayout::kRows || interleavable(kType), "%s has no interleaved layout", dtype_name(kType));
  INFERD_ASSERT(g.layout == WeightLayout::kRows || g.r0 % kInterleaveRows == 0, "an interleaved GEMM starts at a group");
  if (g.m <= 0 || g.r1 <= g.r0) return;
  const int64_t nb = g.k / 32;
  const int64_t npairs = (g.m + 1) / 2;
  Scratch& s = scratch();
  if (s.pairs.size() < static_cast<size_t>(npairs * nb)) s.pairs.resize(static_cast<size_t>(npairs * nb));
  pack_pairs<kType>(g, nb, npairs, s.pairs.data());
  const int64_t m_pad = (g.m + 7) / 8 * 8;
  if constexpr (kType == DType::kQ4_1) {
    if (s.act_sums.size() < static_cast<size_t>(nb * m_pad)) s.act_sums.resize(static_cast<size_t>(nb * m_pad));
    gemm_tiles::pack_act_sums(g, nb, m_pad, s.act_sums.data());
  }
  alignas(64) float summs[kRows][2 * kPairs];
  gemm_tiles::walk<kRows, kPairs>(g, npairs, [&](int64_t r, int nr, int64_t p0, int np, float (*res)[2 * kPairs]) {
    const TileIo io{&g, r, s.pairs.data() + p0 * nb, nb,
                    kType == DType::kQ4_1 ? s.act_sums.data() + 2 * p0 : nullptr, m_pad, res, summs};
    gemm_tiles::TileTable<TileOf<kType>, kRows, kPairs>::kTable[nr - 1][np - 1](io);
    if constexpr (kType == DType::kQ4_1) gemm_tiles::add_min_terms(nr, 2 * np, summs, res);
  });
}

// ---- Q8_0: 16 weight rows in lanes ---------------------------------------------------------------
// The contract's 8 lanes per row and block (lane i: the exact integer dot n_i of elements 4i..4i+3) become 8
// registers per activation row, each holding lane i of 16 weight rows: codes[i] lane r is row r's quants 4i..4i+3 as
// q + 128 (unsigned), and one vpdpbusd from the start value -128 * (the activation's 4 bytes summed) gives n_i of
// the 16 rows. Per block, 16 rows and an activation row: 8 vpdpbusd, 8 fma and one multiply (d_w * d_a for the 16
// rows), where the pair tile above spends 8 of each (a multiply per row and pair of activation rows). The lanes
// are then reduced as ggml's: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).

// One block column of 16 rows, unpacked. Rows past the matrix are zero.
struct alignas(64) RowGroup16Q8 {
  uint32_t codes[8][16];  // [lane][row]: 4 quants + 128
  float d[16];
};
static_assert(sizeof(RowGroup16Q8) == 576);

void unpack_rows16_q8_0(const GemmArgs& g, int64_t row0, int nr, int64_t nb, RowGroup16Q8* out) {
  const float* half = scalar::fp16_table();
  const __m256i sign_bit = _mm256_set1_epi8(static_cast<char>(0x80));
  gemm_tiles::RowBlocks<BlockQ8_0> rows[16];
  for (int r = 0; r < nr; ++r) rows[r] = gemm_tiles::row_blocks<BlockQ8_0>(g, row0 + r);
  for (int64_t b = 0; b < nb; ++b) {
    RowGroup16Q8& o = out[b];
    for (int h = 0; h < 2; ++h) {
      __m256i y[8];
      for (int j = 0; j < 8; ++j) {
        const int r = 8 * h + j;
        y[j] = r < nr ? _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[r].qs(b))), sign_bit)
                      : _mm256_setzero_si256();
      }
      gemm_tiles::transpose8_into<16>(y, o.codes, 8 * h);
    }
    for (int r = 0; r < 16; ++r) o.d[r] = r < nr ? half[rows[r].d(b)] : 0.0f;
  }
}

// One activation row's block: its 32 quants, the start value of each lane, its scale.
struct alignas(4) ActBlockQ8 {
  int8_t q[32];
  int32_t start[8];
  float d;
};
static_assert(sizeof(ActBlockQ8) == 68);

// Activation rows per register tile: 8 accumulators each.
constexpr int kQ8Tokens = 3;
// (Blocks in chunks that stay in L1 while every activation row passes over them, the accumulators waiting in
// memory between chunks, as the AVX2 tile does, were slower here: 93 against 99 GMAC/s at k = 2048 and 85 against
// 88 at 5632 on a Zen 4 EPYC, inferd-gemm-bench.)

// out[t] lane r: row r of the group against activation row t < T (act: T rows, act_rows_apart blocks apart), the
// 8 lanes reduced as ggml's.
template <int T>
void tile16_q8_0(const RowGroup16Q8* w, int64_t nb, const ActBlockQ8* act, int64_t act_rows_apart, __m512 out[]) {
  __m512 acc[T][8];
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < 8; ++i) acc[t][i] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    const RowGroup16Q8& wb = w[b];
    const __m512 dw = _mm512_load_ps(wb.d);
    __m512 scale[T];
    for (int t = 0; t < T; ++t) scale[t] = _mm512_mul_ps(dw, _mm512_set1_ps(act[t * act_rows_apart + b].d));
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const __m512i codes = _mm512_load_si512(wb.codes[i]);
      for (int t = 0; t < T; ++t) {
        const ActBlockQ8& a = act[t * act_rows_apart + b];
        const __m512i y = gemm_tiles::broadcast32_x16(a.q + 4 * i);
        const __m512i n = _mm512_dpbusd_epi32(_mm512_set1_epi32(a.start[i]), codes, y);
        acc[t][i] = _mm512_fmadd_ps(scale[t], _mm512_cvtepi32_ps(n), acc[t][i]);
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    const __m512* a = acc[t];
    out[t] = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                           _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])));
  }
}

void gemm_q8_0(const GemmArgs& g) {
  thread_local gemm_tiles::Block32Scratch<ActBlockQ8, RowGroup16Q8> s;
  const float* half = scalar::fp16_table();
  const __m256i ones = _mm256_set1_epi8(1);
  const bool work = s.prepare(g, DType::kQ8_0, [&](const BlockQ8_0& a, ActBlockQ8& dst) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst.q), q);
    const __m256i sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst.start), _mm256_mullo_epi32(sums, _mm256_set1_epi32(-128)));
    dst.d = half[a.d];
  });
  if (!work) return;
  const int64_t nb = g.k / 32;
  __m512 res[kQ8Tokens];
  gemm_tiles::repacked_walk<16>(
      g, gemm_tiles::token_block(nb * static_cast<int64_t>(sizeof(ActBlockQ8))), kQ8Tokens, false,
      [&](int64_t row0, int nr) { unpack_rows16_q8_0(g, row0, nr, nb, s.group.data()); },
      [&](int64_t t, int nt, bool, int64_t row0, int nr) {
        const ActBlockQ8* act = s.acts.data() + t * nb;
        gemm_tiles::with_count<kQ8Tokens>(nt, [&](auto n) { tile16_q8_0<n>(s.group.data(), nb, act, nb, res); });
        for (int i = 0; i < nt; ++i) gemm_tiles::store_rows16(g, t + i, row0, nr, res[i]);
      });
}

}  // namespace

GemmFn kernel(DType type) {
  switch (type) {
    case DType::kQ4_0:
      return &gemm<DType::kQ4_0>;
    case DType::kQ4_1:
      return &gemm<DType::kQ4_1>;
    case DType::kQ5_0:
      return &gemm<DType::kQ5_0>;
    case DType::kQ8_0:
      return &gemm_q8_0;
    default:
      return nullptr;
  }
}

}  // namespace inferd::kernels::gemm_avx512
