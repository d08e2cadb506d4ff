// x86_common.h (private) — small helpers the x86 kernel translation units share (x86_kernels.inc, compiled
// once for AVX2 and once for AVX-512, and the AVX2 / AVX-512 GEMMs).
//
// Everything here has internal linkage: each translation unit is compiled for its own instruction set,
// and an inline function with external linkage would be merged across them by the linker, which could
// then run an AVX-512 copy on a CPU that only has AVX2.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "inferd/dtype.h"

namespace inferd::kernels {
namespace {

inline float h2f(fp16_t h) { return _cvtsh_ss(h); }

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

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

}  // namespace
}  // namespace inferd::kernels
