// inferd/dtype.h — tensor element types and their block layouts.
//
// The numeric values equal ggml's `ggml_type`, so a GGUF tensor's type field maps directly.
// Block layouts are bit-identical to ggml's (they are a file format: static_asserts below).
// Thread safety: constants and pure functions only.
#pragma once

#include <cstddef>
#include <cstdint>

namespace inferd {

enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kBF16 = 30,
};

struct DTypeInfo {
  DType type;
  const char* name;     // "Q4_K", as llama.cpp prints it
  int64_t block_size;   // elements per block (1 for F32/F16/BF16)
  size_t block_bytes;   // bytes per block
  bool weight_type;     // the engine computes with tensors of this type
};

// Information for a raw type value read from a file; nullptr when the value is unknown.
const DTypeInfo* dtype_info(uint32_t raw);
inline const DTypeInfo* dtype_info(DType t) { return dtype_info(static_cast<uint32_t>(t)); }
const char* dtype_name(DType t);

// Bytes of a row of `n` elements; n must be a multiple of the block size (asserted).
size_t dtype_row_bytes(DType t, int64_t n);

// ---- Block layouts (identical to ggml) ------------------------------------------------------
using fp16_t = uint16_t;  // IEEE half, stored as bits

constexpr int kQK4_0 = 32, kQK4_1 = 32, kQK5_0 = 32, kQK5_1 = 32, kQK8_0 = 32, kQK8_1 = 32;
constexpr int kQK_K = 256, kKScaleSize = 12;
constexpr int kQK4_NL = 32;

struct BlockQ4_0 { fp16_t d; uint8_t qs[kQK4_0 / 2]; };
struct BlockQ4_1 { fp16_t d; fp16_t m; uint8_t qs[kQK4_1 / 2]; };
struct BlockQ5_0 { fp16_t d; uint8_t qh[4]; uint8_t qs[kQK5_0 / 2]; };
struct BlockQ5_1 { fp16_t d; fp16_t m; uint8_t qh[4]; uint8_t qs[kQK5_1 / 2]; };
struct BlockQ8_0 { fp16_t d; int8_t qs[kQK8_0]; };
struct BlockQ8_1 { fp16_t d; fp16_t s; int8_t qs[kQK8_1]; };  // s = d * sum(qs)
// Q2_K: 16 groups of 16; scales[g] = 4-bit scale | 4-bit min << 4; value = d * sc * q - dmin * mn, q in 0..3.
struct BlockQ2_K { uint8_t scales[kQK_K / 16]; uint8_t qs[kQK_K / 4]; fp16_t d; fp16_t dmin; };
// Q3_K: 16 groups of 16 with 6-bit scales (packed in 12 bytes, stored + 32); q = 2 low bits - 4 where
// the hmask bit is clear: value = d * (sc - 32) * q, q in -4..3.
struct BlockQ3_K { uint8_t hmask[kQK_K / 8]; uint8_t qs[kQK_K / 4]; uint8_t scales[kKScaleSize]; fp16_t d; };
struct BlockQ4_K { fp16_t d; fp16_t dmin; uint8_t scales[kKScaleSize]; uint8_t qs[kQK_K / 2]; };
struct BlockQ5_K { fp16_t d; fp16_t dmin; uint8_t scales[kKScaleSize]; uint8_t qh[kQK_K / 8]; uint8_t qs[kQK_K / 2]; };
struct BlockQ6_K { uint8_t ql[kQK_K / 2]; uint8_t qh[kQK_K / 4]; int8_t scales[kQK_K / 16]; fp16_t d; };
struct BlockQ8_K { float d; int8_t qs[kQK_K]; int16_t bsums[kQK_K / 16]; };
// The non-linear 4-bit types: a code indexes kIq4nlValues. IQ4_NL: blocks of 32 with one scale; IQ4_XS:
// super-blocks of 256 with a 6-bit scale (stored + 32) per 32, low 4 bits in scales_l, high 2 in scales_h.
struct BlockIQ4_NL { fp16_t d; uint8_t qs[kQK4_NL / 2]; };
struct BlockIQ4_XS { fp16_t d; uint16_t scales_h; uint8_t scales_l[kQK_K / 64]; uint8_t qs[kQK_K / 2]; };
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136);

// Q3_K's 16 six-bit scales unpacked as ggml unpacks them (still + 32): the low 4 bits from scales[0..7],
// the high 2 from scales[8..11].
inline void q3_k_scales(const BlockQ3_K& b, int sc[16]) {
  for (int g = 0; g < 16; ++g) {
    const int low = g < 8 ? b.scales[g] & 0x0F : b.scales[g - 8] >> 4;
    const int high = (b.scales[8 + g % 4] >> (2 * (g / 4))) & 3;
    sc[g] = low | (high << 4);
  }
}

}  // namespace inferd
