// inferd/kernels/quantize.h — reference weight quantizers (round to nearest, as ggml's
// quantize_row_*_ref). Used by tests and by the tools that write synthetic models; the engine never
// quantizes weights itself. Not tuned for speed.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>

#include "inferd/dtype.h"

namespace inferd::kernels {

// Whether quantize_row_ref supports `type` (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1).
bool has_quantize_ref(DType type);

// Quantizes `n` floats (a multiple of the block size) to `type` into `dst`
// (dtype_row_bytes(type, n) bytes). Asserts that the type is supported.
void quantize_row_ref(DType type, const float* src, void* dst, int64_t n);

}  // namespace inferd::kernels
