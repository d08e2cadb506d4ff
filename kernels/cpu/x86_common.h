// x86_common.h (private) — small helpers the x86 kernel translation units share (x86_kernels.inc, compiled
// once for AVX2 and once for AVX-512, and the AVX2 / AVX-512 GEMMs).
//
// Everything here has internal linkage: each translation unit is compiled for its own instruction set,
// and an inline function with external linkage would be merged across them by the linker, which could
// then run an AVX-512 copy on a CPU that only has AVX2.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "inferd/dtype.h"
#include "inferd/weight_layout.h"

namespace inferd::kernels {
namespace {

inline float h2f(fp16_t h) { return _cvtsh_ss(h); }

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// The four bytes at p (any alignment) as one int32; broadcast4: in every 32-bit lane (one vpbroadcastd from memory).
inline int32_t load_i32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline __m256i broadcast4(const void* p) { return _mm256_set1_epi32(load_i32(p)); }

// For Q4_0's repacked-order GEMVs: per Q8_0 activation block i < n, start[i] = -8 * (sum of its 32 codes) (the
// weight codes enter as 0..15, so each row's exact integer starts there) and scale[i] = its d as float. Eight
// blocks per pass: their lane sums in three levels of hadd.
inline void q4_0_block_starts(const BlockQ8_0* a, int64_t n, int32_t* start, float* scale) {
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < n; i += 8) {
    __m256i s[8];
    for (int64_t j = 0; j < 8; ++j) {
      s[j] = i + j < n ? _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, load32(a[i + j].qs)), ones16)
                       : _mm256_setzero_si256();
    }
    // q0: blocks i..i+3 (their low 128-bit halves' sums in the low half, the high halves' in the high), q1: the next 4.
    const __m256i q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    const __m256i q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
    const __m256i sums =
        _mm256_add_epi32(_mm256_permute2x128_si256(q0, q1, 0x20), _mm256_permute2x128_si256(q0, q1, 0x31));
    alignas(32) int32_t v[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(v), _mm256_slli_epi32(sums, 3));
    for (int64_t j = 0; j < 8 && i + j < n; ++j) {
      start[i + j] = -v[j];
      scale[i + j] = h2f(a[i + j].d);
    }
  }
}

// Blocks (k = 16384) per run of Q4_0's repacked-order dot_x16_groups: a run's starts and scales wait in L1 (4 KiB).
constexpr int64_t kQ4_0Run = 512;

// The walk both ISAs' Q4_0 dot_x16_groups take: per run of up to kQ4_0Run blocks its q4_0_block_starts, once, then
// for each group g < n run(col, y, n_run, start, scale, resume, out + 16 g): col the group's first block column of
// the run, y the run's activation blocks, resume whether the 16 accumulators continue from out (every run but the
// first) instead of starting at 0.
template <typename Run>
inline void q4_0_group_runs(int64_t k, const void* groups, size_t group_bytes, int n, const void* act, float* out,
                            Run&& run) {
  const auto* a = static_cast<const BlockQ8_0*>(act);
  const int64_t nb = k / 32;
  alignas(64) int32_t start[kQ4_0Run];
  alignas(64) float scale[kQ4_0Run];
  for (int64_t b0 = 0; b0 < nb; b0 += kQ4_0Run) {
    const int64_t n_run = std::min(kQ4_0Run, nb - b0);
    q4_0_block_starts(a + b0, n_run, start, scale);
    for (int g = 0; g < n; ++g) {
      const uint8_t* col =
          static_cast<const uint8_t*>(groups) + g * group_bytes + static_cast<size_t>(b0) * Q4_0Column::kBytes;
      run(col, a + b0, n_run, start, scale, b0 > 0, out + 16 * g);
    }
  }
}

// The sum of the 8 int32 lanes (exact).
inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// The 8 six-bit scales (bytes 0..7) and mins (bytes 8..15) of a Q4_K/Q5_K block, as ggml unpacks them.
inline void unpack_k4_scales(const uint8_t* packed, uint32_t out[4]) {
  constexpr uint32_t kMask1 = 0x3f3f3f3f, kMask2 = 0x0f0f0f0f, kMask3 = 0x03030303;
  uint32_t u[3];
  std::memcpy(u, packed, sizeof(u));
  out[0] = u[0] & kMask1;
  out[1] = (u[2] & kMask2) | (((u[0] >> 6) & kMask3) << 4);
  out[2] = u[1] & kMask1;
  out[3] = ((u[2] >> 4) & kMask2) | (((u[1] >> 6) & kMask3) << 4);
}

// unpack_k4_scales in one register: bytes 0..7 the scales, 8..15 the mins. Reads 16 bytes at `packed` (the
// 12 packed bytes and 4 after them, which every caller's block or block column has).
inline __m128i unpack_k4_scales_sse(const uint8_t* packed) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));  // dwords u0, u1, u2, -
  const __m128i low = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4)),
                                    _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
  const __m128i high = _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)), 2),
                                     _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
  return _mm_or_si128(low, high);
}

// The 16 six-bit group scales of a Q3_K block minus 32 (-32..31), as ggml's AVX2 kernel unpacks them.
inline __m128i unpack_q3_k_scales(const uint8_t* packed) {
  constexpr uint32_t kMask1 = 0x03030303, kMask2 = 0x0f0f0f0f;
  uint32_t aux[3];
  std::memcpy(aux, packed, sizeof(aux));
  const __m128i sc = _mm_set_epi32(static_cast<int>(((aux[1] >> 4) & kMask2) | (((aux[2] >> 6) & kMask1) << 4)),
                                   static_cast<int>(((aux[0] >> 4) & kMask2) | (((aux[2] >> 4) & kMask1) << 4)),
                                   static_cast<int>((aux[1] & kMask2) | (((aux[2] >> 2) & kMask1) << 4)),
                                   static_cast<int>((aux[0] & kMask2) | (((aux[2] >> 0) & kMask1) << 4)));
  return _mm_sub_epi8(sc, _mm_set1_epi8(32));
}

// A Q2_K block's 16 group scales (the low nibbles of its scale bytes) as int8 and its 16 group mins (the high
// nibbles) as int16.
inline void q2_k_scales_mins(const BlockQ2_K& b, __m128i& sc8, __m256i& mins16) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
  const __m128i m4 = _mm_set1_epi8(0xF);
  sc8 = _mm_and_si128(packed, m4);
  mins16 = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4));
}

// Q6_K's +32 codes (0..63) of chunk j (0..3) of a block half, from the half's two 32-byte ql chunks l0, l1 and
// its 32 qh bytes h: the low nibbles of l0 (j = 0) and l1 (j = 1), then their high nibbles (j = 2, 3), with bits
// 2j..2j+1 of h as bits 4..5.
inline __m256i q6_k_codes(__m256i l0, __m256i l1, __m256i h, int j) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i l = j % 2 == 0 ? l0 : l1;
  const __m256i lo4 = j < 2 ? _mm256_and_si256(l, nibble) : _mm256_and_si256(_mm256_srli_epi16(l, 4), nibble);
  const __m256i hi2 = j == 0   ? _mm256_slli_epi16(h, 4)
                      : j == 1 ? _mm256_slli_epi16(h, 2)
                      : j == 2 ? h
                               : _mm256_srli_epi16(h, 2);
  return _mm256_or_si256(lo4, _mm256_and_si256(hi2, _mm256_set1_epi8(0x30)));
}

// Chunk c (elements 32c..32c+31) of a 2-bit plane block (Q2_K, Q3_K: 64 bytes of qs, four chunks per 32
// bytes): the codes 0..3 as bytes.
inline __m256i two_bit_codes(const uint8_t* qs, int c) {
  const __m256i bits = load32(qs + 32 * (c / 4));
  return _mm256_and_si256(_mm256_srli_epi16(bits, 2 * (c % 4)), _mm256_set1_epi8(3));
}

// Q3_K chunk c's "4 where the hmask bit is clear, else 0" (ggml subtracts it from the two low bits): bit c
// of every byte shifted to bit 2 (a 16-bit shift by at most 5 places only moves bit 2 of a byte within that
// byte), then 4 and-not it.
inline __m256i q3_k_fours(__m256i hbits, int c) {
  const __m256i at2 = c < 2 ? _mm256_slli_epi16(hbits, 2 - c) : c > 2 ? _mm256_srli_epi16(hbits, c - 2) : hbits;
  return _mm256_andnot_si256(at2, _mm256_set1_epi8(4));
}

// The int16 scales of a super-block's 32-element chunks, from its 16 int8 group scales (Q2_K, Q3_K, Q6_K:
// groups of 16 elements), as ggml's AVX2 kernels form them: the scales widened once per block, groups 0..7
// in both 128-bit lanes of one register and 8..15 in another; chunk c's scales (int16 lanes 0..7 group 2c,
// 8..15 group 2c + 1: get_scale_shuffle_q3k) are then one byte shuffle.
class ChunkScales {
 public:
  ChunkScales() : half_{_mm256_setzero_si256(), _mm256_setzero_si256()} {}
  explicit ChunkScales(__m128i sc8) {
    const __m256i all = _mm256_cvtepi8_epi16(sc8);
    half_[0] = _mm256_permute2x128_si256(all, all, 0x00);
    half_[1] = _mm256_permute2x128_si256(all, all, 0x11);
  }
  __m256i operator()(int c) const {
    return _mm256_shuffle_epi8(half_[c / 4], _mm256_load_si256(reinterpret_cast<const __m256i*>(kPick[c % 4])));
  }

 private:
  // kPick[j]: the bytes of int16 2j in the low 128-bit lane, of int16 2j + 1 in the high one.
  alignas(32) static constexpr int8_t kPick[4][32] = {
      {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
      {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
      {8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11},
      {12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13,
       14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15}};
  __m256i half_[2];
};

// The 32 non-linear values of 16 packed bytes: low nibbles (elements 0..15), then high nibbles. The bytes in
// both 128-bit lanes, the high lane's shifted down a nibble, then one lookup over the whole register.
inline __m256i iq4_values(const uint8_t* qs) {
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
  const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  const __m256i codes =
      _mm256_and_si256(_mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0F));
  return _mm256_shuffle_epi8(table, codes);
}

// Signed bytes x * y, adjacent pairs summed to int16 (ggml's mul_add_epi8, sign trick and all; no pair
// can saturate here).
inline __m256i mul_add_i8(__m256i x, __m256i y) {
  return _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

// IQ4_XS sub-block s's scale (6 bits, stored + 32), as ggml's AVX2 kernel forms it.
inline int16_t iq4_xs_scale(const BlockIQ4_XS& b, int s) {
  const int low = (b.scales_l[s / 2] >> (4 * (s % 2))) & 0xF;
  const int high = (b.scales_h >> (2 * s)) & 3;
  return static_cast<int16_t>((low | (high << 4)) - 32);
}

}  // namespace
}  // namespace inferd::kernels
