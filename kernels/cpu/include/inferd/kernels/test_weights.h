// inferd/kernels/test_weights.h — weight rows of every type the backends compute with, for tests: the
// backend-ops suite's cases, the OpenCL tests' synthetic models.
//
// F32 and F16 come from the given floats, BF16 by truncating them to their top 16 bits, the
// 32-element block types through kernels::quantize_row_ref. The K-quants, IQ4_NL and IQ4_XS have no
// reference quantizer: their blocks are random bytes (every code, scale and fifth bit pattern is valid)
// with d and dmin set so that the values spread about as far as the floats, around zero. Deterministic
// for a given seed.
// Thread safety: pure functions.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>

#include "inferd/kernels/cpu.h"
#include "inferd/dtype.h"
#include "inferd/kernels/quantize.h"

namespace inferd::kernels::testing {

// Whether encode_weight_row() can write `type`.
inline bool can_encode_weights(DType type) {
  switch (type) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kIQ4_NL:
    case DType::kIQ4_XS: return true;
    default: return kernels::has_quantize_ref(type);
  }
}

// One row of `n` elements of `type` into `dst` (dtype_row_bytes(type, n) bytes). `values` are the
// floats to encode (F32, F16, BF16, the 32-element block types); K-quant rows are random blocks from
// `seed` whose values reach about `spread` in magnitude.
inline void encode_weight_row(DType type, const float* values, int64_t n, uint32_t seed, float spread, void* dst) {
  auto* out = static_cast<uint8_t*>(dst);
  switch (type) {
    case DType::kF32: std::memcpy(dst, values, static_cast<size_t>(n) * sizeof(float)); return;
    case DType::kF16: kernels::fp32_to_fp16_row(values, static_cast<fp16_t*>(dst), n); return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &values[i], sizeof(bits));
        const auto top = static_cast<uint16_t>(bits >> 16);
        std::memcpy(out + 2 * i, &top, sizeof(top));
      }
      return;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kIQ4_NL:
    case DType::kIQ4_XS: break;
    default: kernels::quantize_row_ref(type, values, dst, n); return;
  }
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> jitter(0.8f, 1.2f);
  const size_t row_bytes = dtype_row_bytes(type, n);
  for (size_t i = 0; i < row_bytes; ++i) out[i] = static_cast<uint8_t>(byte(rng));
  // The scale fields of the other block types (random bytes elsewhere), at their offsets.
  auto set_half = [&](size_t offset, float v) {
    const fp16_t h = kernels::fp32_to_fp16(v);
    std::memcpy(out + offset, &h, sizeof(h));
  };
  if (type == DType::kIQ4_NL) {  // |kvalues| about 50 on average
    for (int64_t b = 0; b < n / kQK4_NL; ++b) {
      set_half(static_cast<size_t>(b) * sizeof(BlockIQ4_NL) + offsetof(BlockIQ4_NL, d), spread / 64.0f * jitter(rng));
    }
    return;
  }
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    if (type == DType::kQ2_K) {  // sc * q about 7.5 * 1.5; dmin * mn (mn about 7.5) centres them
      const size_t at = static_cast<size_t>(b) * sizeof(BlockQ2_K);
      const float d = spread / 11.25f * jitter(rng);
      set_half(at + offsetof(BlockQ2_K, d), d);
      set_half(at + offsetof(BlockQ2_K, dmin), d * 1.5f);
      continue;
    }
    if (type == DType::kQ3_K) {  // |(sc - 32) * q| about 16 * 2
      set_half(static_cast<size_t>(b) * sizeof(BlockQ3_K) + offsetof(BlockQ3_K, d), spread / 32.0f * jitter(rng));
      continue;
    }
    if (type == DType::kIQ4_XS) {  // |(ls - 32) * kvalues| about 16 * 50
      set_half(static_cast<size_t>(b) * sizeof(BlockIQ4_XS) + offsetof(BlockIQ4_XS, d), spread / 800.0f * jitter(rng));
      continue;
    }
    if (type == DType::kQ6_K) {
      // |scale * (q - 32)| is about 64 * 16 on average.
      BlockQ6_K blk;
      std::memcpy(&blk, out + static_cast<size_t>(b) * sizeof(blk), sizeof(blk));
      blk.d = kernels::fp32_to_fp16(spread / 1024.0f * jitter(rng));
      std::memcpy(out + static_cast<size_t>(b) * sizeof(blk), &blk, sizeof(blk));
    } else {
      // sc * q averages 31.5 * 7.5 (15.5 for Q5_K's codes), mn 31.5: dmin centres the values on zero.
      const float mean_q = type == DType::kQ4_K ? 7.5f : 15.5f;
      const float d = spread / (31.5f * mean_q) * jitter(rng);
      const fp16_t dh = kernels::fp32_to_fp16(d), mh = kernels::fp32_to_fp16(d * mean_q);
      const size_t block_bytes = type == DType::kQ4_K ? sizeof(BlockQ4_K) : sizeof(BlockQ5_K);
      // d and dmin lead both layouts.
      std::memcpy(out + static_cast<size_t>(b) * block_bytes, &dh, sizeof(dh));
      std::memcpy(out + static_cast<size_t>(b) * block_bytes + sizeof(dh), &mh, sizeof(mh));
    }
  }
}

}  // namespace inferd::kernels::testing
