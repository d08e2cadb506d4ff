// repacked_avx2.cpp — the MatmulOrder::kRepacked kernels of Q4_0 and IQ4_NL (inferd/kernels/cpu.h) for AVX2 + FMA
// + F16C: the dot product, Q4_0's decode GEMV on interleaved weights, and the table of the repacked types (Q4_K's
// kernels are in x86_kernels.inc, beside the integer sums they share with the vec_dot order). Their GEMMs are in
// gemm_avx2.cpp.
//
// The order: per 32-element block one exact integer dot n (weights -8..7, IQ4_NL's -127..113, times Q8_0
// activations), then acc = fma(float(n), d_w * d_a, acc), block after block, one accumulator per output (llama.cpp's
// repacked q4_0_8x8 and iq4_nl_8x8 GEMV and GEMM). Every kernel here equals scalar.cpp's dot_q4_0_repacked or
// dot_iq4_nl_repacked bit for bit.
//
// dot_x16 keeps the group's 16 rows in float lanes (two ymm of 8 rows), so the one fma per block and row is
// two fmas per block column. The integer dots: a 32-byte load is half a piece of Q4_0Column, 8 rows' quant bytes
// 4c..4c+3 (one row per 32-bit lane); its low nibbles (elements 4c..4c+3) and high nibbles (16+4c..16+4c+3) meet
// the activation's matching four bytes, broadcast, by maddubs; the block's 8 such int16 pair sums add up in their
// lanes and one madd leaves each row's int32: no horizontal sums (the row-contiguous column of the previous
// layout needed three levels of vphaddw and a permute per 8 rows: 27 -> 32 GB/s from L2 on one Zen 4 core). The
// nibbles enter as 0..15; the -8 is the block's -8 * sum(a), added to all rows, and computed once per call for
// all its groups (dot_x16_groups).
#include <immintrin.h>

#include "isa_tables.h"
#include "x86_common.h"
#include "inferd/weight_layout.h"

namespace inferd::kernels::avx2 {
namespace {

// The block's 32 weights as signed bytes, elements 0..15 in the low 128 bits, 16..31 in the high: Q4_0's codes - 8,
// IQ4_NL's non-linear values.
inline __m256i block_values(const BlockQ4_0& b) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  const __m256i codes = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(0x0F));
  return _mm256_sub_epi8(codes, _mm256_set1_epi8(8));
}
inline __m256i block_values(const BlockIQ4_NL& b) { return iq4_values(b.qs); }

// Q4_0 and IQ4_NL (the same order in llama.cpp: q4_0_8x8 and iq4_nl_8x8 share one kernel): per block the exact
// integer dot by ggml's sign trick (|w| <= 127 and |a| <= 127: the int16 pair sums cannot saturate).
template <typename Block, int NR>
void dot_nr(int64_t k, const void* w_row, const void* act, size_t stride, float* out) {
  const auto* w = static_cast<const Block*>(w_row);
  const BlockQ8_0* a[NR];
  for (int r = 0; r < NR; ++r) a[r] = reinterpret_cast<const BlockQ8_0*>(static_cast<const uint8_t*>(act) + r * stride);
  const __m256i ones16 = _mm256_set1_epi16(1);
  float acc[NR] = {};
  for (int64_t b = 0; b < k / 32; ++b) {
    const __m256i ws = block_values(w[b]);
    const __m256i wabs = _mm256_sign_epi8(ws, ws);
    const float dw = h2f(w[b].d);
    for (int r = 0; r < NR; ++r) {
      const __m256i aq = load32(a[r][b].qs);
      const int32_t n = hsum_i32(_mm256_madd_epi16(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(aq, ws)), ones16));
      acc[r] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(static_cast<float>(n)), _mm_set_ss(dw * h2f(a[r][b].d)),
                                          _mm_set_ss(acc[r])));
    }
  }
  for (int r = 0; r < NR; ++r) out[r] = acc[r];
}

template <typename Block>
void dot_block32(int64_t k, const void* w, const void* act, size_t stride, int nr, float* out) {
  switch (nr) {
    case 1: return dot_nr<Block, 1>(k, w, act, stride, out);
    case 2: return dot_nr<Block, 2>(k, w, act, stride, out);
    case 3: return dot_nr<Block, 3>(k, w, act, stride, out);
    default: return dot_nr<Block, 4>(k, w, act, stride, out);
  }
}

// Block columns ahead that dot_x16 asks for (as the vec_dot order's AVX2 GEMV of Q4_0: it is compute-bound,
// so the hardware prefetcher alone falls behind).
constexpr int kAheadColumns = 16;

// One run of q4_0_group_runs (x86_common.h) for one group.
void q4_0_run_x16(const uint8_t* col, const BlockQ8_0* a, int64_t n_run, const int32_t* start, const float* scale,
                  bool resume, float* out) {
  constexpr size_t kColumn = Q4_0Column::kBytes;
  const __m256i low4 = _mm256_set1_epi8(0x0F), ones16 = _mm256_set1_epi16(1);
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  if (resume) {
    acc[0] = _mm256_loadu_ps(out);
    acc[1] = _mm256_loadu_ps(out + 8);
  }
  for (int64_t i = 0; i < n_run; ++i, col += kColumn) {
    for (size_t off = 0; off < kColumn; off += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(col) + kAheadColumns * kColumn + off, _MM_HINT_T0);
    }
    const int8_t* y = a[i].qs;
    __m256i y_lo[4], y_hi[4];
    for (int c = 0; c < 4; ++c) {
      y_lo[c] = broadcast4(y + 4 * c);
      y_hi[c] = broadcast4(y + 16 + 4 * c);
    }
    const __m256i start_i = _mm256_set1_epi32(start[i]);
    const __m256 da = _mm256_set1_ps(scale[i]);
    for (int h = 0; h < 2; ++h) {
      // Rows 8h..8h+7, one per 32-bit lane: their int16 pair sums over the block's four pieces (codes 0..15,
      // |sum| <= 8 * 2 * 15 * 127 < 32768), then one madd to the row's int32.
      __m256i sum16 = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const __m256i x = load32(col + Q4_0Column::qs(8 * h, c));
        const __m256i lo = _mm256_maddubs_epi16(_mm256_and_si256(x, low4), y_lo[c]);
        const __m256i hi = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(x, 4), low4), y_hi[c]);
        sum16 = _mm256_add_epi16(sum16, _mm256_add_epi16(lo, hi));
      }
      const __m256i n_h = _mm256_add_epi32(_mm256_madd_epi16(sum16, ones16), start_i);
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col + Q4_0Column::d(8 * h))));
      acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(n_h), _mm256_mul_ps(d, da), acc[h]);
    }
  }
  _mm256_storeu_ps(out, acc[0]);
  _mm256_storeu_ps(out + 8, acc[1]);
}

void dot_x16_groups_q4_0(int64_t k, const void* groups, size_t group_bytes, int n, const void* act, float* out) {
  q4_0_group_runs(k, groups, group_bytes, n, act, out, q4_0_run_x16);
}

void dot_x16_q4_0(int64_t k, const void* group, const void* act, float* out) {
  dot_x16_groups_q4_0(k, group, 0, 1, act, out);
}

}  // namespace

const TypeKernels* repacked_type_kernels(DType type) {
  // to_float and quantize_act as in the vec_dot order.
  static const TypeKernels kQ4_0 = [] {
    TypeKernels t = *type_kernels(DType::kQ4_0);
    t.dot = dot_block32<BlockQ4_0>;
    t.dot_w4 = nullptr;
    t.dot_x16 = dot_x16_q4_0;
    t.dot_x16_groups = dot_x16_groups_q4_0;
    return t;
  }();
  static const TypeKernels kQ4_K = [] {
    TypeKernels t = *type_kernels(DType::kQ4_K);
    t.dot = dot_q4_k_repacked;  // x86_kernels.inc
    t.dot_w4 = dot_w4_q4_k_repacked;
    t.dot_x16 = dot_x16_q4_k_repacked;
    return t;
  }();
  static const TypeKernels kIQ4_NL = [] {
    TypeKernels t = *type_kernels(DType::kIQ4_NL);
    t.dot = dot_block32<BlockIQ4_NL>;
    t.dot_w4 = nullptr;
    t.dot_x16 = nullptr;  // IQ4_NL is not interleaved
    return t;
  }();
  switch (type) {
    case DType::kQ4_0:
      return &kQ4_0;
    case DType::kQ4_K:
      return &kQ4_K;
    case DType::kIQ4_NL:
      return &kIQ4_NL;
    default:
      return nullptr;
  }
}

}  // namespace inferd::kernels::avx2
