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

}  // namespace
}  // namespace inferd::kernels
