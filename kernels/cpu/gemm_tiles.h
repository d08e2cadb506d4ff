// gemm_tiles.h (private) — what the SIMD GEMMs (gemm_avx512.cpp, gemm_avx512_k.cpp, gemm_avx2.cpp,
// gemm_avx2_k.cpp) share: ggml's 8-lane reduction, the table of register-tile functions, the walk over
// row chunks and activation pairs that calls a tile and stores its results, and the Q4_1 min term of
// the 32-element GEMMs. Included only by translation units compiled
// for AVX2 or AVX-512 (it uses AVX intrinsics).
#pragma once

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <utility>
#include <vector>

#include "inferd/dtype.h"
#include "inferd/kernels/gemm.h"
#include "inferd/status.h"
#include "inferd/weight_layout.h"
#include "isa_tables.h"
#include "x86_common.h"

// Internal linkage (see x86_common.h): the including translation units are compiled for different
// instruction sets.
namespace inferd::kernels::gemm_tiles {
namespace {

// Activation rows per unpacking of a weight group in the rows-in-lanes GEMMs: their packed blocks
// (act_row_bytes each) within half of this CPU's L2 (256 KiB where it is not known), 16 to 128 rows. Every
// group is unpacked once per token block: on a Zen 4 (1 MiB L2) 128 rows instead of 64 made the Q4_K, Q5_K and
// Q6_K GEMMs 9-10% faster (inferd-gemm-bench --k 2048 --rows 1024 --m 128).
inline int64_t token_block(int64_t act_row_bytes) {
  static const int64_t budget = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? std::clamp<int64_t>(l2 / 2, 128 * 1024, 1024 * 1024) : int64_t{256 * 1024};
  }();
  return std::clamp<int64_t>(budget / std::max<int64_t>(act_row_bytes, 1), 16, 128);
}

// out[i] lane r = dword i of y[r] (an 8 x 8 transpose of dwords).
inline void transpose8(const __m256i y[8], uint32_t (*out)[8]) {
  __m256i t[8], u[8];
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = _mm256_unpacklo_epi32(y[2 * p], y[2 * p + 1]);
    t[2 * p + 1] = _mm256_unpackhi_epi32(y[2 * p], y[2 * p + 1]);
  }
  for (int h = 0; h < 2; ++h) {
    u[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h + 0], t[4 * h + 2]);
    u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h + 0], t[4 * h + 2]);
    u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
    u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(out[i]), _mm256_permute2x128_si256(u[i], u[4 + i], 0x20));
    _mm256_store_si256(reinterpret_cast<__m256i*>(out[i + 4]), _mm256_permute2x128_si256(u[i], u[4 + i], 0x31));
  }
}

// out[i][lane0 + r] = dword i of y[r], r < 8: transpose8 into 8 of the kLanes lanes of each out row (the 16-row
// groups of the AVX-512 repacked GEMMs take two of these).
template <int kLanes>
inline void transpose8_into(const __m256i y[8], uint32_t (*out)[kLanes], int lane0) {
  alignas(32) uint32_t t[8][8];
  transpose8(y, t);
  for (int i = 0; i < 8; ++i) std::memcpy(&out[i][lane0], t[i], sizeof(t[i]));
}

// f(std::integral_constant<int, n>{}) for n = clamp(count, 1, kMax): a tile's activation-row count as the template
// argument its registers are sized by.
template <int kMax, typename F>
inline void with_count(int count, F&& f) {
  if constexpr (kMax > 1) {
    if (count < kMax) return with_count<kMax - 1>(count, f);
  }
  f(std::integral_constant<int, kMax>{});
}

// ggml's reduction of 8 lanes: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
inline float reduce8(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

// The 32-element block GEMMs' weight block and activation block per weight type.
template <DType kType>
struct Traits;
template <>
struct Traits<DType::kQ4_0> {
  using WBlock = BlockQ4_0;
  using ABlock = BlockQ8_0;
};
template <>
struct Traits<DType::kQ4_1> {
  using WBlock = BlockQ4_1;
  using ABlock = BlockQ8_1;
};
template <>
struct Traits<DType::kQ5_0> {
  using WBlock = BlockQ5_0;
  using ABlock = BlockQ8_0;
};
template <>
struct Traits<DType::kQ8_0> {
  using WBlock = BlockQ8_0;
  using ABlock = BlockQ8_0;
};
template <>
struct Traits<DType::kIQ4_NL> {
  using WBlock = BlockIQ4_NL;
  using ABlock = BlockQ8_0;
};

// The fp16 at p (any alignment).
inline fp16_t load_fp16(const uint8_t* p) {
  fp16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Row `row` of g's weight matrix, block by block, in either layout (GemmArgs::layout): block b's fields
// are at base + b * stride plus their offsets. The row layout (GGUF's) has them inside one block; the
// interleaved one (inferd/weight_layout.h) in the block column of the row's 16-row group.
template <typename WBlock>
struct RowBlocks {
  const uint8_t* base;
  size_t stride;
  size_t d_off, m_off, qs_off;
  size_t qh_off[2];  // Q5_0: its qh's two 16-bit halves (bits 0..15, 16..31)
  size_t qs_piece;   // bytes from one 4-byte piece of the quants to the next (4: together; interleaved Q4_0: 64)

  const uint8_t* column(int64_t b) const { return base + static_cast<size_t>(b) * stride; }
  // The block's quants where they are together (not interleaved Q4_0: qs16 reads those), or the first piece.
  const uint8_t* qs(int64_t b) const { return column(b) + qs_off; }
  // The 16 quant bytes of a Q4_0, Q4_1, Q5_0 or IQ4_NL block, in either layout.
  __m128i qs16(int64_t b) const {
    const uint8_t* p = qs(b);
    if (qs_piece == 4) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    uint32_t v[4];
    for (int c = 0; c < 4; ++c) std::memcpy(&v[c], p + qs_piece * static_cast<size_t>(c), 4);
    return _mm_setr_epi32(static_cast<int>(v[0]), static_cast<int>(v[1]), static_cast<int>(v[2]), static_cast<int>(v[3]));
  }
  fp16_t d(int64_t b) const { return load_fp16(column(b) + d_off); }
  fp16_t m(int64_t b) const { return load_fp16(column(b) + m_off); }  // Q4_1
  uint32_t qh(int64_t b) const {                                       // Q5_0
    return static_cast<uint32_t>(load_fp16(column(b) + qh_off[0])) | static_cast<uint32_t>(load_fp16(column(b) + qh_off[1])) << 16;
  }
};

template <typename WBlock>
RowBlocks<WBlock> row_blocks(const GemmArgs& g, int64_t row) {
  constexpr size_t kQuantBytes = sizeof(WBlock::qs);
  constexpr size_t kFields = (sizeof(WBlock) - kQuantBytes) / 2;  // 16-bit header fields before qs
  if (g.layout == WeightLayout::kRows) {
    return {g.w + static_cast<size_t>(row) * g.w_row_bytes, sizeof(WBlock), 0, 2, 2 * kFields, {2, 4}, 4};
  }
  const auto j = static_cast<size_t>(row % kInterleaveRows);
  // Q5_0Column places qh four rows at a time (the d and qs offsets are the generic ones); Q4_0Column the quants in
  // 4-byte pieces.
  static_assert(!std::is_same_v<WBlock, BlockQ5_0> || (Q5_0Column::d(3) == 6 && Q5_0Column::qs(3) == 6 * kInterleaveRows + 3 * kQuantBytes));
  constexpr bool kPieces = std::is_same_v<WBlock, BlockQ4_0>;
  static_assert(!kPieces || (Q4_0Column::d(3) == 6 && Q4_0Column::qs(3, 1) == Q4_0Column::qs(3, 0) + 64));
  return {g.w + static_cast<size_t>(row - static_cast<int64_t>(j)) * g.w_row_bytes,
          kInterleaveRows * sizeof(WBlock),
          2 * j,
          2 * kInterleaveRows + 2 * j,
          kPieces ? Q4_0Column::qs(static_cast<int64_t>(j), 0) : kFields * 2 * kInterleaveRows + j * kQuantBytes,
          {Q5_0Column::qh(static_cast<int64_t>(j), 0), Q5_0Column::qh(static_cast<int64_t>(j), 1)},
          kPieces ? size_t{64} : size_t{4}};
}

// The interleaved block column of a Q4_K / Q5_K matrix (inferd/weight_layout.h).
template <typename Block>
struct KColumnOf;
template <>
struct KColumnOf<BlockQ4_K> {
  using type = Q4KColumn;
};
template <>
struct KColumnOf<BlockQ5_K> {
  using type = Q5KColumn;
};

// Row `row` of a Q4_K or Q5_K matrix, block by block, in either layout: the fields the K-quant tiles read.
template <typename Block>
struct KRowBlocks {
  using Column = typename KColumnOf<Block>::type;
  const uint8_t* base;  // the row (row layout) or its group (interleaved)
  bool interleaved;
  int64_t j;            // the row's index in its group

  const uint8_t* block(int64_t b) const {
    return base + static_cast<size_t>(b) * (interleaved ? Column::kBytes : sizeof(Block));
  }
  fp16_t d(int64_t b) const { return load_fp16(interleaved ? block(b) + Column::d(j) : block(b) + offsetof(Block, d)); }
  fp16_t dmin(int64_t b) const {
    return load_fp16(interleaved ? block(b) + Column::dmin(j) : block(b) + offsetof(Block, dmin));
  }
  // The packed scales and mins (12 bytes, unpack_k4_scales()), then 4 zero bytes.
  struct Scales {
    alignas(16) uint8_t v[16];
  };
  Scales scales(int64_t b) const {
    Scales s{};
    if constexpr (std::is_same_v<Block, BlockQ4_K>) {
      if (interleaved) {  // byte by byte (Q4KColumn)
        for (int i = 0; i < 12; ++i) s.v[i] = block(b)[Q4KColumn::scale(j, i)];
        return s;
      }
    } else {
      if (interleaved) {
        std::memcpy(s.v, block(b) + Column::scales(j), 12);
        return s;
      }
    }
    std::memcpy(s.v, block(b) + offsetof(Block, scales), 12);
    return s;
  }
  // Quant chunk c (32 bytes: sub-blocks 2c (low nibbles) and 2c + 1 (high)). Not for interleaved Q4_K, whose chunks
  // are 8 pieces 64 bytes apart: its GEMMs read the pieces (unpack_q4_k_rows) or a RowLayoutView.
  __m256i chunk(int64_t b, int c) const {
    if constexpr (std::is_same_v<Block, BlockQ4_K>) {
      INFERD_ASSERT(!interleaved, "Q4KColumn's chunks are pieces");
    } else {
      if (interleaved) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block(b) + Column::qs(j, c)));
    }
    return _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(block(b) + offsetof(Block, qs) + 32 * static_cast<size_t>(c)));
  }
  // Q5_K's fifth bits (32 bytes).
  const uint8_t* qh(int64_t b) const {
    static_assert(std::is_same_v<Block, BlockQ5_K>);
    return interleaved ? block(b) + Q5KColumn::qh(j) : block(b) + offsetof(BlockQ5_K, qh);
  }
};

template <typename Block>
KRowBlocks<Block> k_row_blocks(const GemmArgs& g, int64_t row) {
  if (g.layout == WeightLayout::kRows) return {g.w + static_cast<size_t>(row) * g.w_row_bytes, false, 0};
  const int64_t j = row % kInterleaveRows;
  return {g.w + static_cast<size_t>(row - j) * g.w_row_bytes, true, j};
}

// Sub-block s (32 elements, in order) of super-block b of a Q4_K row: its codes 0..15 as bytes (chunk s / 2's low
// nibbles for even s, high nibbles for odd s).
inline __m256i q4_k_sub_block_codes(const KRowBlocks<BlockQ4_K>& row, int64_t b, int s) {
  const __m256i x = row.chunk(b, s / 2);
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  return s % 2 == 0 ? _mm256_and_si256(x, nibble) : _mm256_and_si256(_mm256_srli_epi16(x, 4), nibble);
}

// The sums bsum_2s + bsum_2s+1 (s = 0..7) of one activation super-block, as int16 (the repacked Q4_K GEMMs).
struct alignas(16) KPairSums {
  int16_t v[8];
};

// out[b] = the KPairSums of the nb super-blocks of activation row a.
inline void k_pair_sums(const BlockQ8_K* a, int64_t nb, KPairSums* out) {
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].bsums));
    _mm_store_si128(reinterpret_cast<__m128i*>(out[b].v),
                    _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1)));
  }
}

// Rows row0 .. row0 + nr - 1 (nr <= Group::kRows; row0 a multiple of 8) of a Q4_K matrix (either layout), all nb
// super-blocks, into the rows-in-lanes groups of a repacked Q4_K GEMM: lane r of codes[s][i] holds row r's codes of
// elements 32s + 4i .. + 3 (0..15); mins[j] holds mn_2j and mn_2j+1 of row r in int16 lanes 2r and 2r + 1; d and
// dmin; the sub-block scales go through Group::set_scale(s, r, sc), in the form each GEMM's multiply reads. Rows
// past nr have zero scales, mins, d and dmin (their codes are zero, or in the interleaved layout those of the group's
// next rows, which the pieces hold side by side), so their lanes compute 0.
template <typename Group>
void unpack_q4_k_rows(const GemmArgs& g, int64_t row0, int nr, int64_t nb, Group* out) {
  constexpr int kRows = Group::kRows;
  static_assert(kRows % 8 == 0);
  const float* half = scalar::fp16_table();
  KRowBlocks<BlockQ4_K> rows[kRows];
  for (int r = 0; r < nr; ++r) rows[r] = k_row_blocks<BlockQ4_K>(g, row0 + r);
  const bool pieces = g.layout == WeightLayout::kInterleaved16;
  INFERD_ASSERT(!pieces || row0 % 8 == 0, "8 rows of one interleaved group per slice");
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    Group& o = out[b];
    for (int h = 0; h < kRows / 8; ++h) {
      if (pieces) {  // Q4KColumn's pieces are 8 rows' codes side by side already
        for (int c = 0; c < 4; ++c) {
          for (int t = 0; t < 8; ++t) {
            const __m256i x = 8 * h < nr ? load32(rows[8 * h].block(b) + Q4KColumn::qs(rows[8 * h].j, c, t))
                                         : _mm256_setzero_si256();
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(&o.codes[2 * c][t][8 * h]), _mm256_and_si256(x, nibble));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(&o.codes[2 * c + 1][t][8 * h]),
                                _mm256_and_si256(_mm256_srli_epi16(x, 4), nibble));
          }
        }
        continue;
      }
      for (int s = 0; s < 8; ++s) {
        __m256i y[8];
        for (int j = 0; j < 8; ++j) {
          const int r = 8 * h + j;
          y[j] = r < nr ? q4_k_sub_block_codes(rows[r], b, s) : _mm256_setzero_si256();
        }
        transpose8_into<kRows>(y, o.codes[s], 8 * h);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      uint8_t sm[16] = {};  // scales 0..7, mins 8..15
      if (r < nr) unpack_k4_scales(rows[r].scales(b).v, reinterpret_cast<uint32_t*>(sm));
      for (int s = 0; s < 8; ++s) o.set_scale(s, r, sm[s]);
      for (int j = 0; j < 4; ++j) {
        o.mins[j][2 * r] = sm[8 + 2 * j];
        o.mins[j][2 * r + 1] = sm[9 + 2 * j];
      }
      o.d[r] = r < nr ? half[rows[r].d(b)] : 0.0f;
      o.dmin[r] = r < nr ? half[rows[r].dmin(b)] : 0.0f;
    }
  }
}

// The 32-bit value at p in all 8 lanes (vbroadcastss: a load-port operation).
inline __m256i broadcast32(const void* p) { return _mm256_castps_si256(_mm256_broadcast_ss(static_cast<const float*>(p))); }

// lanes[r] -> output row row0 + r (r < nr) of activation row t, as the GemmArgs ask (accumulate, bias).
inline void store_lanes(const GemmArgs& g, int64_t t, int64_t row0, int nr, const float* lanes) {
  float* o = g.out + t * g.out_stride + row0;
  for (int r = 0; r < nr; ++r) {
    if (g.accumulate) {
      o[r] += lanes[r];
    } else {
      o[r] = g.bias != nullptr ? lanes[r] + g.bias[row0 + r] : lanes[r];
    }
  }
}

// Lane r of v -> output row row0 + r (r < nr) of activation row t (store_lanes).
inline void store_rows8(const GemmArgs& g, int64_t t, int64_t row0, int nr, __m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  store_lanes(g, t, row0, nr, lanes);
}

#ifdef __AVX512F__
// The AVX-512 GEMMs' forms (gemm_avx512*.cpp): the 32-bit value at p in all 16 lanes (vpbroadcastd from memory: a
// load-port operation), and lane r of v -> output row row0 + r (r < nr) of activation row t (store_lanes).
inline __m512i broadcast32_x16(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

inline void store_rows16(const GemmArgs& g, int64_t t, int64_t row0, int nr, __m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  store_lanes(g, t, row0, nr, lanes);
}
#endif

// Whether the GEMM has rows to compute (an interleaved one must start at a group).
inline bool has_work(const GemmArgs& g) {
  INFERD_ASSERT(g.layout == WeightLayout::kRows || g.r0 % kInterleaveRows == 0, "an interleaved GEMM starts at a group");
  return g.m > 0 && g.r1 > g.r0;
}

// The activation side and weight scratch of a GEMM over 32-element blocks with Q8_0 activations (Act: one
// activation block as the tile reads it; Group: one block column of the current rows, unpacked). prepare() checks
// the arguments, says false when there is nothing to do, and fills acts[t * nb + b] by convert(block b of activation
// row t, that Act).
template <typename Act, typename Group>
struct Block32Scratch {
  std::vector<Act> acts;     // [activation row][block]
  std::vector<Group> group;  // [block] of the current rows

  template <typename Convert>
  bool prepare(const GemmArgs& g, DType type, Convert&& convert) {
    INFERD_ASSERT(g.type == type && g.k % 32 == 0, "this GEMM is %s's", dtype_name(type));
    if (!has_work(g)) return false;
    const int64_t nb = g.k / 32;
    if (acts.size() < static_cast<size_t>(g.m * nb)) acts.resize(static_cast<size_t>(g.m * nb));
    if (group.size() < static_cast<size_t>(nb)) group.resize(static_cast<size_t>(nb));
    for (int64_t t = 0; t < g.m; ++t) {
      const auto* a = reinterpret_cast<const BlockQ8_0*>(g.act + static_cast<size_t>(t) * g.act_stride);
      for (int64_t b = 0; b < nb; ++b) convert(a[b], acts[static_cast<size_t>(t * nb + b)]);
    }
    return true;
  }
};

// The activation side and weight scratch of a repacked Q4_K GEMM (Group: one super-block of its rows, unpacked):
// each activation row's KPairSums, computed by prepare(), which also checks the arguments and says false when
// there is nothing to do.
template <typename Group>
struct RepackedKScratch {
  std::vector<KPairSums> pairs;  // [activation row][super-block]
  std::vector<Group> group;      // [super-block] of the current rows

  static const BlockQ8_K* act_row(const GemmArgs& g, int64_t t) {
    return reinterpret_cast<const BlockQ8_K*>(g.act + static_cast<size_t>(t) * g.act_stride);
  }
  bool prepare(const GemmArgs& g) {
    INFERD_ASSERT(g.type == DType::kQ4_K && g.k % kQK_K == 0, "this GEMM is Q4_K's");
    if (!has_work(g)) return false;
    const int64_t nb = g.k / kQK_K;
    if (pairs.size() < static_cast<size_t>(g.m * nb)) pairs.resize(static_cast<size_t>(g.m * nb));
    if (group.size() < static_cast<size_t>(nb)) group.resize(static_cast<size_t>(nb));
    for (int64_t t = 0; t < g.m; ++t) k_pair_sums(act_row(g, t), nb, pairs.data() + t * nb);
    return true;
  }
};

// The walk of the rows-in-lanes GEMMs of MatmulOrder::kRepacked (gemm_avx2.cpp, gemm_avx512_repacked.cpp): the
// activation rows in blocks of token_block; in each, the weight rows in groups of kRows, unpacked once per group
// (unpack(row0, nr), nr <= kRows rows); then tiles of at most max_tokens activation rows, none crossing
// m4 = m - m % 4 when split_m4 (llama.cpp's Q4_K GEMM takes the rows before m4, its GEMV the rest):
// tile(t, nt, gemm_row, row0, nr), gemm_row = t < m4.
template <int kRows, typename Unpack, typename Tile>
void repacked_walk(const GemmArgs& g, int64_t token_block, int max_tokens, bool split_m4, Unpack&& unpack, Tile&& tile) {
  const int64_t m4 = split_m4 ? g.m - g.m % 4 : g.m;
  for (int64_t t0 = 0; t0 < g.m; t0 += token_block) {
    const int64_t t_end = std::min(g.m, t0 + token_block);
    for (int64_t row0 = g.r0; row0 < g.r1; row0 += kRows) {
      const int nr = static_cast<int>(std::min<int64_t>(kRows, g.r1 - row0));
      unpack(row0, nr);
      for (int64_t t = t0; t < t_end;) {
        const bool gemm_row = t < m4;
        const int nt = static_cast<int>(std::min<int64_t>(max_tokens, (gemm_row ? std::min(t_end, m4) : t_end) - t));
        tile(t, nt, gemm_row, row0, nr);
        t += nt;
      }
    }
  }
}

// Row `row` of a Q6_K matrix, block by block, in either layout (Q6KColumn when interleaved).
struct Q6RowBlocks {
  const uint8_t* base;
  bool interleaved;
  int64_t j;

  const uint8_t* block(int64_t b) const {
    return base + static_cast<size_t>(b) * (interleaved ? Q6KColumn::kBytes : sizeof(BlockQ6_K));
  }
  // ql bytes 32k..32k+31 (k = 0..3), qh bytes 32h..32h+31 (h = 0, 1).
  const uint8_t* ql(int64_t b, int k) const {
    return interleaved ? block(b) + Q6KColumn::chunk(j, k) : block(b) + offsetof(BlockQ6_K, ql) + 32 * static_cast<size_t>(k);
  }
  const uint8_t* qh(int64_t b, int h) const {
    return interleaved ? block(b) + Q6KColumn::chunk(j, 4 + h) : block(b) + offsetof(BlockQ6_K, qh) + 32 * static_cast<size_t>(h);
  }
  const int8_t* scales(int64_t b) const {
    return reinterpret_cast<const int8_t*>(interleaved ? block(b) + Q6KColumn::scales(j) : block(b) + offsetof(BlockQ6_K, scales));
  }
  fp16_t d(int64_t b) const {
    return load_fp16(interleaved ? block(b) + Q6KColumn::d(j) : block(b) + offsetof(BlockQ6_K, d));
  }
};

inline Q6RowBlocks q6_row_blocks(const GemmArgs& g, int64_t row) {
  if (g.layout == WeightLayout::kRows) return {g.w + static_cast<size_t>(row) * g.w_row_bytes, false, 0};
  const int64_t j = row % kInterleaveRows;
  return {g.w + static_cast<size_t>(row - j) * g.w_row_bytes, true, j};
}

// Rows row0 .. row0 + nr - 1 (nr <= Group::kRows, a multiple of 8) of a Q6_K matrix (either layout), all nb
// super-blocks, into the rows-in-lanes groups of a tiled Q6_K GEMM: lane r of codes[g][i] holds row r's codes of
// elements 16g + 4i .. + 3 (0..63); pairs[j] sc_2j and sc_2j+1 of row r in int16 lanes 2r and 2r + 1 (the codes'
// +32, by a madd with the activation's group sums); d; the group scales go through Group::set_scale(g, r, sc), in
// the form each GEMM's multiply reads. Rows past nr are zero.
template <typename Group>
void unpack_q6_k_rows(const GemmArgs& g, int64_t row0, int nr, int64_t nb, Group* out) {
  constexpr int kRows = Group::kRows;
  static_assert(kRows % 8 == 0);
  const float* half = scalar::fp16_table();
  Q6RowBlocks rows[kRows];
  for (int r = 0; r < nr; ++r) rows[r] = q6_row_blocks(g, row0 + r);
  for (int64_t b = 0; b < nb; ++b) {
    Group& o = out[b];
    for (int c = 0; c < 8; ++c) {  // chunk c = 4 * half + j: groups 2c and 2c + 1
      const int hf = c / 4;
      for (int h = 0; h < kRows / 8; ++h) {
        __m256i y[8];
        for (int j = 0; j < 8; ++j) {
          const int r = 8 * h + j;
          y[j] = r < nr ? q6_k_codes(load32(rows[r].ql(b, 2 * hf)), load32(rows[r].ql(b, 2 * hf + 1)),
                                     load32(rows[r].qh(b, hf)), c % 4)
                        : _mm256_setzero_si256();
        }
        alignas(32) uint32_t t[8][8];  // dwords 0..3 of chunk c are group 2c's, 4..7 group 2c + 1's
        transpose8(y, t);
        for (int i = 0; i < 8; ++i) std::memcpy(&o.codes[2 * c + i / 4][i % 4][8 * h], t[i], sizeof(t[i]));
      }
    }
    for (int r = 0; r < kRows; ++r) {
      const int8_t* sc = r < nr ? rows[r].scales(b) : nullptr;
      for (int gg = 0; gg < 16; ++gg) o.set_scale(gg, r, sc != nullptr ? sc[gg] : 0);
      for (int j = 0; j < 8; ++j) {
        o.pairs[j][2 * r] = static_cast<int16_t>(sc != nullptr ? sc[2 * j] : 0);
        o.pairs[j][2 * r + 1] = static_cast<int16_t>(sc != nullptr ? sc[2 * j + 1] : 0);
      }
      o.d[r] = r < nr ? half[rows[r].d(b)] : 0.0f;
    }
  }
}

// Q4_1: s_a of every block and activation row, transposed to [block][token] (m_pad tokens per block,
// the rows past g.m repeating the last) for the tiles' min-term step.
inline void pack_act_sums(const GemmArgs& g, int64_t nb, int64_t m_pad, float* out) {
  const float* half = scalar::fp16_table();
  for (int64_t t = 0; t < m_pad; ++t) {
    const int64_t src_t = std::min(t, g.m - 1);
    const auto* a = reinterpret_cast<const BlockQ8_1*>(g.act + static_cast<size_t>(src_t) * g.act_stride);
    for (int64_t b = 0; b < nb; ++b) out[b * m_pad + t] = half[a[b].s];
  }
}

// Q4_1: res[i][t] = res[i][t] + summs[i][t], the min-term chain added last, as the dot kernels do.
template <size_t kCols>
inline void add_min_terms(int rows, int cols, const float (*summs)[kCols], float (*res)[kCols]) {
  for (int i = 0; i < rows; ++i) {
    for (int t = 0; t < cols; ++t) res[i][t] = res[i][t] + summs[i][t];
  }
}

// table[R - 1][P - 1] = Tile::template fn<R, P>, for R in 1..kRows, P in 1..kPairs.
template <typename Tile, int kRows, int kPairs>
struct TileTable {
  using Fn = decltype(&Tile::template fn<1, 1>);

  template <int R, int... Ps>
  static constexpr std::array<Fn, kPairs> row(std::integer_sequence<int, Ps...>) {
    return {&Tile::template fn<R, Ps + 1>...};
  }
  template <int... Rs>
  static constexpr std::array<std::array<Fn, kPairs>, kRows> make(std::integer_sequence<int, Rs...>) {
    return {row<Rs + 1>(std::make_integer_sequence<int, kPairs>())...};
  }
  static constexpr std::array<std::array<Fn, kPairs>, kRows> kTable = make(std::make_integer_sequence<int, kRows>());
};

// Walks rows [g.r0, g.r1) in chunks whose weights stay in L2 while every activation tile passes over
// them: on_chunk(first_row, end_row) before each chunk, then for each tile of up to kRows rows and kPairs activation
// pairs run_tile(first_row, n_rows, first_pair, n_pairs, res), which fills res[i][t] (row first_row + i,
// activation row 2 * first_pair + t), then stores res into g.out as the contract says (bias or accumulate).
template <int kRows, int kPairs, typename RunTile, typename OnChunk>
void walk(const GemmArgs& g, int64_t npairs, RunTile&& run_tile, OnChunk&& on_chunk) {
  constexpr size_t kChunkBytes = 256 * 1024;
  // Interleaved weights: whole 16-row groups per chunk, so that no group is deinterleaved twice (RowLayoutView).
  const int64_t step = g.layout == WeightLayout::kInterleaved16 ? std::lcm<int64_t>(kRows, kInterleaveRows) : kRows;
  const int64_t chunk_rows = std::max<int64_t>(step, static_cast<int64_t>(kChunkBytes / g.w_row_bytes) / step * step);
  alignas(64) float res[kRows][2 * kPairs];
  for (int64_t rc = g.r0; rc < g.r1; rc += chunk_rows) {
    const int64_t rc_end = std::min(g.r1, rc + chunk_rows);
    on_chunk(rc, rc_end);
    for (int64_t p0 = 0; p0 < npairs; p0 += kPairs) {
      const int np = static_cast<int>(std::min<int64_t>(kPairs, npairs - p0));
      const int64_t t_end = std::min(g.m, 2 * (p0 + np));
      for (int64_t r = rc; r < rc_end; r += kRows) {
        const int nr = static_cast<int>(std::min<int64_t>(kRows, rc_end - r));
        run_tile(r, nr, p0, np, res);
        for (int i = 0; i < nr; ++i) {
          for (int64_t t = 2 * p0; t < t_end; ++t) {
            const float v = res[i][t - 2 * p0];
            float& o = g.out[t * g.out_stride + r + i];
            if (g.accumulate) {
              o += v;
            } else {
              o = g.bias != nullptr ? v + g.bias[r + i] : v;
            }
          }
        }
      }
    }
  }
}
template <int kRows, int kPairs, typename RunTile>
void walk(const GemmArgs& g, int64_t npairs, RunTile&& run_tile) {
  walk<kRows, kPairs>(g, npairs, run_tile, [](int64_t, int64_t) {});
}

// The weights that the row-by-row (vec_dot-order) K-quant tiles read: g's own, except where g's blocks are
// Q4KColumn's pieces, from which those tiles would gather each row's chunks 4 bytes at a time (a third to a half of
// their speed): there load(), the walk's on_chunk, deinterleaves the groups of the chunk's rows once into a
// thread-local buffer in the row layout, and args() and row() address them there.
class RowLayoutView {
 public:
  explicit RowLayoutView(const GemmArgs& g)
      : g_(g), view_(g), active_(g.type == DType::kQ4_K && g.layout == WeightLayout::kInterleaved16) {
    view_.layout = WeightLayout::kRows;
  }
  void load(int64_t first_row, int64_t end_row) {
    if (!active_) return;
    thread_local std::vector<uint8_t> rows;
    first_ = first_row / kInterleaveRows * kInterleaveRows;
    const int64_t groups = (end_row - first_ + kInterleaveRows - 1) / kInterleaveRows;
    rows.resize(static_cast<size_t>(groups * kInterleaveRows) * g_.w_row_bytes);
    deinterleave_groups(g_.type, g_.k, groups, g_.w + static_cast<size_t>(first_) * g_.w_row_bytes, rows.data());
    view_.w = rows.data();
  }
  const GemmArgs& args() const { return active_ ? view_ : g_; }
  int64_t row(int64_t r) const { return active_ ? r - first_ : r; }

 private:
  const GemmArgs& g_;
  GemmArgs view_;
  bool active_;
  int64_t first_ = 0;
};

}  // namespace
}  // namespace inferd::kernels::gemm_tiles
