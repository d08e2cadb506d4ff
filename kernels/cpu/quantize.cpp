// Reference weight quantizers (inferd/kernels/quantize.h), following ggml's quantize_row_*_ref
// rounding so synthetic models quantize the way llama.cpp's tools would.
#include "inferd/kernels/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "inferd/kernels/cpu.h"
#include "inferd/status.h"

namespace inferd::kernels {
namespace {

void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    for (int j = 0; j < 32; ++j) y[b].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

// The signed value of largest magnitude (the first one on ties).
float signed_absmax(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 32) {
    const float d = signed_absmax(x) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
      y[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quantize_q4_1(const float* x, BlockQ4_1* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 32) {
    float min = x[0], max = x[0];
    for (int j = 1; j < 32; ++j) {
      min = std::min(min, x[j]);
      max = std::max(max, x[j]);
    }
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    y[b].m = fp32_to_fp16(min);
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - min) * id + 0.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j + 16] - min) * id + 0.5f)));
      y[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

template <typename Block>
void pack_q5(Block& y, const int q[32]) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    y.qs[j] = static_cast<uint8_t>((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
    qh |= static_cast<uint32_t>((q[j] & 0x10) >> 4) << j;
    qh |= static_cast<uint32_t>((q[j + 16] & 0x10) >> 4) << (j + 16);
  }
  std::memcpy(y.qh, &qh, sizeof(qh));
}

void quantize_q5_0(const float* x, BlockQ5_0* y, int64_t nb) {
  int q[32];
  for (int64_t b = 0; b < nb; ++b, x += 32) {
    const float d = signed_absmax(x) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    for (int j = 0; j < 32; ++j) q[j] = std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f)));
    pack_q5(y[b], q);
  }
}

void quantize_q5_1(const float* x, BlockQ5_1* y, int64_t nb) {
  int q[32];
  for (int64_t b = 0; b < nb; ++b, x += 32) {
    float min = x[0], max = x[0];
    for (int j = 1; j < 32; ++j) {
      min = std::min(min, x[j]);
      max = std::max(max, x[j]);
    }
    const float d = (max - min) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    y[b].m = fp32_to_fp16(min);
    for (int j = 0; j < 32; ++j) q[j] = static_cast<int>((x[j] - min) * id + 0.5f);
    pack_q5(y[b], q);
  }
}

}  // namespace

bool has_quantize_ref(DType type) {
  switch (type) {
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
      return true;
    default:
      return false;
  }
}

void quantize_row_ref(DType type, const float* src, void* dst, int64_t n) {
  INFERD_ASSERT(has_quantize_ref(type), "no reference quantizer for this type");
  INFERD_ASSERT(n % 32 == 0, "row length not a multiple of 32");
  const int64_t nb = n / 32;
  switch (type) {
    case DType::kQ8_0:
      return quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), nb);
    case DType::kQ4_0:
      return quantize_q4_0(src, static_cast<BlockQ4_0*>(dst), nb);
    case DType::kQ4_1:
      return quantize_q4_1(src, static_cast<BlockQ4_1*>(dst), nb);
    case DType::kQ5_0:
      return quantize_q5_0(src, static_cast<BlockQ5_0*>(dst), nb);
    case DType::kQ5_1:
      return quantize_q5_1(src, static_cast<BlockQ5_1*>(dst), nb);
    default:
      return;
  }
}

}  // namespace inferd::kernels
