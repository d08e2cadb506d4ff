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
// two fmas per block column. The integer dots: a 32-byte load is two rows' 16 quant bytes; low and high
// nibbles (elements 0..15 and 16..31) times the activation's halves (each broadcast to both 128-bit lanes)
// by maddubs, the two added as int16, two levels of int16 hadd over four such registers and one madd leave
// one int32 per row (lanes rows 0,2,4,6 | 1,3,5,7, put in order by one permute). The nibbles enter as 0..15;
// the -8 is the block's -8 * sum(a), added to all rows.
#include <immintrin.h>

#include "isa_tables.h"
#include "x86_common.h"
#include "inferd/weight_layout.h"

namespace inferd::kernels::avx2 {
namespace {

// -8 * the sum of an activation block's 32 quants.
inline int32_t minus8_sum(__m256i aq) {
  return -8 * hsum_i32(_mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), aq), _mm256_set1_epi16(1)));
}

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

// Rows 2j (low 128 bits) and 2j + 1 (high) of a block column: eight int16 partial dots each (codes 0..15,
// |value| <= 2 * 2 * 15 * 127).
inline __m256i row_pair_dots(const uint8_t* qs, __m256i a_lo, __m256i a_hi) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
  const __m256i lo = _mm256_and_si256(q, low);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
  return _mm256_add_epi16(_mm256_maddubs_epi16(lo, a_lo), _mm256_maddubs_epi16(hi, a_hi));
}

// Rows 0..7 of the 128 quant bytes at qs: their integer dots (codes 0..15), in row order. Two levels of
// int16 hadd (|sum| <= 4 * 7620 < 32768), then one madd to int32.
inline __m256i eight_row_dots(const uint8_t* qs, __m256i a_lo, __m256i a_hi) {
  const __m256i h0 = _mm256_hadd_epi16(row_pair_dots(qs, a_lo, a_hi), row_pair_dots(qs + 32, a_lo, a_hi));
  const __m256i h1 = _mm256_hadd_epi16(row_pair_dots(qs + 64, a_lo, a_hi), row_pair_dots(qs + 96, a_lo, a_hi));
  const __m256i n = _mm256_madd_epi16(_mm256_hadd_epi16(h0, h1), _mm256_set1_epi16(1));  // rows 0,2,4,6 | 1,3,5,7
  return _mm256_permutevar8x32_epi32(n, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Block columns ahead that dot_x16 asks for (as the vec_dot order's AVX2 GEMV of Q4_0: it is compute-bound,
// so the hardware prefetcher alone falls behind).
constexpr int kAheadColumns = 16;

void dot_x16_q4_0(int64_t k, const void* group, const void* act, float* out) {
  constexpr size_t kColumn = kInterleaveRows * sizeof(BlockQ4_0);  // d[16], then qs[16][16]
  const auto* col = static_cast<const uint8_t*>(group);
  const auto* a = static_cast<const BlockQ8_0*>(act);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (int64_t b = 0; b < k / 32; ++b, col += kColumn) {
    for (size_t off = 0; off < kColumn; off += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(col) + kAheadColumns * kColumn + off, _MM_HINT_T0);
    }
    const __m256i aq = load32(a[b].qs);
    const __m256i a_lo = _mm256_permute2x128_si256(aq, aq, 0x00);
    const __m256i a_hi = _mm256_permute2x128_si256(aq, aq, 0x11);
    const __m256i start = _mm256_set1_epi32(minus8_sum(aq));
    const __m256 da = _mm256_set1_ps(h2f(a[b].d));
    const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col)));
    const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col + 16)));
    const __m256i n0 = _mm256_add_epi32(eight_row_dots(col + 32, a_lo, a_hi), start);
    const __m256i n1 = _mm256_add_epi32(eight_row_dots(col + 32 + 128, a_lo, a_hi), start);
    acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(n0), _mm256_mul_ps(d0, da), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(n1), _mm256_mul_ps(d1, da), acc1);
  }
  _mm256_storeu_ps(out, acc0);
  _mm256_storeu_ps(out + 8, acc1);
}

}  // namespace

const TypeKernels* repacked_type_kernels(DType type) {
  // to_float and quantize_act as in the vec_dot order.
  static const TypeKernels kQ4_0 = [] {
    TypeKernels t = *type_kernels(DType::kQ4_0);
    t.dot = dot_block32<BlockQ4_0>;
    t.dot_w4 = nullptr;
    t.dot_x16 = dot_x16_q4_0;
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
