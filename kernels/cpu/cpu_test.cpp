// Tests for inferd_kernels_cpu: every type on every ISA this CPU runs, against the scalar reference
// and against independent element-by-element decoders written here from ggml's format description.
//
// Tolerances:
//   * dequantization, activation quantization, fp16 conversion: bit-exact;
//   * integer dot products: |got - ref| <= 1e-5 * S, S = 2 * max|w| * sum|a| over the dequantized
//     row (a bound on every per-block term, so only float summation order may differ);
//   * float helpers: |got - ref| <= 1e-5 * sum|x*y| + 1e-6.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <cstdio>
#include <cstddef>
#include <cstring>
#include <random>
#include <vector>

#include "inferd/kernels/cpu.h"
#include "inferd/weight_layout.h"
#include "inferd/kernels/quantize.h"

namespace inferd::kernels {
namespace {

constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};
constexpr DType kWeightTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,
                                  DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                                  DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ2_K,
                                  DType::kQ3_K, DType::kIQ4_NL, DType::kIQ4_XS};

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Independent fp16 decoder: value = (-1)^s * 2^(e-15) * (1 + m/1024), subnormals 2^-14 * m/1024.
float half_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  const float sign = s ? -1.0f : 1.0f;
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -24);
  if (e == 31) return m ? std::nanf("") : sign * INFINITY;
  return sign * std::ldexp(1.0f + m / 1024.0f, e - 15);
}

uint16_t rand_half(std::mt19937& rng, float lo, float hi) {
  return fp32_to_fp16(std::uniform_real_distribution<float>(lo, hi)(rng));
}

std::vector<uint8_t> random_bytes(std::mt19937& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// A row of `n` random weights of `type` with sane scales (random quants, scales in a small range).
std::vector<uint8_t> random_weights(std::mt19937& rng, DType type, int64_t n) {
  std::vector<uint8_t> row = random_bytes(rng, dtype_row_bytes(type, n));
  const DTypeInfo* info = dtype_info(type);
  const int64_t nb = n / info->block_size;
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  auto put = [&](int64_t b, size_t off, uint16_t v) { std::memcpy(&row[b * info->block_bytes + off], &v, 2); };
  for (int64_t b = 0; b < nb; ++b) {
    switch (type) {
      case DType::kF32: {
        const float v = uni(rng);
        std::memcpy(&row[b * 4], &v, 4);
        break;
      }
      case DType::kF16:
        put(b, 0, fp32_to_fp16(uni(rng)));
        break;
      case DType::kBF16:
        put(b, 0, static_cast<uint16_t>(float_to_bits(uni(rng)) >> 16));
        break;
      case DType::kQ4_1:
      case DType::kQ5_1:
        put(b, 0, rand_half(rng, 0.001f, 0.1f));
        put(b, 2, rand_half(rng, -0.5f, 0.5f));
        break;
      case DType::kQ8_0:
      case DType::kQ4_0:
      case DType::kQ5_0:
        put(b, 0, rand_half(rng, -0.1f, 0.1f));
        break;
      case DType::kQ4_K:
      case DType::kQ5_K:
        put(b, 0, rand_half(rng, 0.0001f, 0.01f));
        put(b, 2, rand_half(rng, 0.0001f, 0.01f));
        break;
      case DType::kQ6_K:
        put(b, offsetof(BlockQ6_K, d), rand_half(rng, -0.01f, 0.01f));
        break;
      case DType::kQ2_K:
        put(b, offsetof(BlockQ2_K, d), rand_half(rng, 0.001f, 0.1f));
        put(b, offsetof(BlockQ2_K, dmin), rand_half(rng, 0.001f, 0.1f));
        break;
      case DType::kQ3_K:
        put(b, offsetof(BlockQ3_K, d), rand_half(rng, -0.01f, 0.01f));
        break;
      case DType::kIQ4_NL:
        put(b, 0, rand_half(rng, -0.01f, 0.01f));
        break;
      case DType::kIQ4_XS:
        put(b, 0, rand_half(rng, -0.001f, 0.001f));
        break;
      default:
        ADD_FAILURE() << "no generator for " << dtype_name(type);
    }
  }
  return row;
}

// `rows` random rows of `type` back to back (the row layout of a rows x n matrix).
std::vector<uint8_t> random_matrix(std::mt19937& rng, DType type, int64_t n, int64_t rows) {
  std::vector<uint8_t> m;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<uint8_t> row = random_weights(rng, type, n);
    m.insert(m.end(), row.begin(), row.end());
  }
  return m;
}

std::vector<float> random_floats(std::mt19937& rng, int64_t n, float scale = 1.0f) {
  std::vector<float> v(n);
  std::normal_distribution<float> normal(0.0f, scale);
  for (auto& x : v) x = normal(rng);
  return v;
}

// A random activation row of n elements (scale 3) quantized as weights of `type` consume it (the scalar
// reference's act_type encoding).
std::vector<uint8_t> random_act(std::mt19937& rng, DType type, int64_t n) {
  const TypeKernels* ref = type_kernels(type, Isa::kScalar);
  std::vector<uint8_t> act(dtype_row_bytes(ref->act_type, n));
  const std::vector<float> x = random_floats(rng, n, 3.0f);
  ref->quantize_act(x.data(), act.data(), n);
  return act;
}

// ---- Independent decoders (one element at a time, straight from the format description) --------

uint32_t le32(const uint8_t* p) { return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24); }
uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// 6-bit scale and min of sub-block s (0..7) of a Q4_K/Q5_K block's 12 scale bytes.
void k4_scale_min(const uint8_t* sc, int s, int* scale, int* min) {
  if (s < 4) {
    *scale = sc[s] & 63;
    *min = sc[s + 4] & 63;
  } else {
    *scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
    *min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
  }
}

float reference_element(DType type, const uint8_t* row, int64_t e) {
  const DTypeInfo* info = dtype_info(type);
  const uint8_t* b = row + (e / info->block_size) * info->block_bytes;
  const int j = static_cast<int>(e % info->block_size);
  auto nib = [&](const uint8_t* qs) { return j < 16 ? qs[j] & 15 : qs[j - 16] >> 4; };
  switch (type) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, b, 4);
      return f;
    }
    case DType::kF16:
      return half_value(le16(b));
    case DType::kBF16:
      return bits_to_float(static_cast<uint32_t>(le16(b)) << 16);
    case DType::kQ8_0:
      return half_value(le16(b)) * static_cast<int8_t>(b[2 + j]);
    case DType::kQ4_0:
      return half_value(le16(b)) * (nib(b + 2) - 8);
    case DType::kQ4_1:
      return half_value(le16(b)) * nib(b + 4) + half_value(le16(b + 2));
    case DType::kQ5_0:
      return half_value(le16(b)) * ((nib(b + 6) | static_cast<int>(((le32(b + 2) >> j) & 1) << 4)) - 16);
    case DType::kQ5_1:
      return half_value(le16(b)) * (nib(b + 8) | static_cast<int>(((le32(b + 4) >> j) & 1) << 4)) +
             half_value(le16(b + 2));
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const int s = j / 32, c = j / 64, l = j % 32;
      const bool high_nibble = (j % 64) >= 32;
      const uint8_t* qs = b + (type == DType::kQ4_K ? 16 : 48);
      int q = high_nibble ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 15;
      if (type == DType::kQ5_K) q |= ((b[16 + l] >> s) & 1) << 4;
      int scale, min;
      k4_scale_min(b + 4, s, &scale, &min);
      return half_value(le16(b)) * scale * q - half_value(le16(b + 2)) * min;
    }
    case DType::kQ6_K: {
      const int half = j / 128, t = (j % 128) / 32, l = j % 32;
      const uint8_t* ql = b + 64 * half;
      const uint8_t* qh = b + 128 + 32 * half;
      const int low = (t & 1) ? ql[l + 32] : ql[l];
      const int q = (((t & 2) ? low >> 4 : low & 15) | (((qh[l] >> (2 * t)) & 3) << 4)) - 32;
      return half_value(le16(b + 208)) * static_cast<int8_t>(b[192 + j / 16]) * q;
    }
    case DType::kQ2_K: {  // scales[16], qs[64], d, dmin
      const int c = j / 128, shift = 2 * ((j % 128) / 32), l = j % 32, g = j / 16;
      const int q = (b[16 + 32 * c + l] >> shift) & 3;
      return half_value(le16(b + 80)) * (b[g] & 15) * q - half_value(le16(b + 82)) * (b[g] >> 4);
    }
    case DType::kQ3_K: {  // hmask[32], qs[64], scales[12], d
      const int c = j / 128, t = (j % 128) / 32, l = j % 32, g = j / 16;
      const int q = ((b[32 + 32 * c + l] >> (2 * t)) & 3) - (((b[l] >> (4 * c + t)) & 1) ? 0 : 4);
      const int low = g < 8 ? b[96 + g] & 15 : b[96 + g - 8] >> 4;
      const int scale = low | (((b[96 + 8 + g % 4] >> (2 * (g / 4))) & 3) << 4);
      return half_value(le16(b + 108)) * (scale - 32) * q;
    }
    case DType::kIQ4_NL: {
      static constexpr int kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
      return half_value(le16(b)) * kValues[nib(b + 2)];
    }
    case DType::kIQ4_XS: {  // d, scales_h, scales_l[4], qs[128]
      static constexpr int kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
      const int s = j / 32, l = j % 32;
      const int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 15) | (((le16(b + 2) >> (2 * s)) & 3) << 4);
      const int code = l < 16 ? b[8 + 16 * s + l] & 15 : b[8 + 16 * s + l - 16] >> 4;
      return half_value(le16(b)) * (ls - 32) * kValues[code];
    }
    default:
      ADD_FAILURE() << "no reference decoder for " << dtype_name(type);
      return 0.0f;
  }
}

// ---- Types and dispatch -------------------------------------------------------------------

TEST(DType, InfoMatchesGgml) {
  EXPECT_EQ(dtype_info(12u)->type, DType::kQ4_K);
  EXPECT_STREQ(dtype_name(DType::kQ4_1), "Q4_1");
  EXPECT_EQ(dtype_info(4u), nullptr);  // removed from ggml
  EXPECT_EQ(dtype_info(1000u), nullptr);
  EXPECT_EQ(dtype_row_bytes(DType::kQ4_1, 64), 40u);
  EXPECT_EQ(dtype_row_bytes(DType::kQ6_K, 512), 420u);
  EXPECT_EQ(dtype_row_bytes(DType::kQ2_K, 512), 168u);
  EXPECT_EQ(dtype_row_bytes(DType::kQ3_K, 512), 220u);
  EXPECT_EQ(dtype_row_bytes(DType::kIQ4_NL, 64), 36u);
  EXPECT_EQ(dtype_row_bytes(DType::kIQ4_XS, 512), 272u);
  EXPECT_STREQ(dtype_name(DType::kIQ4_XS), "IQ4_XS");
  EXPECT_EQ(dtype_row_bytes(DType::kF16, 3), 6u);
}

TEST(Dispatch, TablesExistAndFallBack) {
  EXPECT_TRUE(isa_available(best_isa()));
  EXPECT_TRUE(isa_available(Isa::kScalar));
  for (Isa isa : kAllIsas) {
    for (DType t : kWeightTypes) {
      const TypeKernels* k = type_kernels(t, isa);
      ASSERT_NE(k, nullptr) << dtype_name(t) << " " << isa_name(isa);
      EXPECT_EQ(k->type, t);
      EXPECT_NE(k->dot, nullptr);
    }
  }
  EXPECT_EQ(type_kernels(DType::kQ8_K, Isa::kScalar), nullptr);  // an activation type only
  EXPECT_EQ(type_kernels(DType::kQ2_K)->act_type, DType::kQ8_K);
  EXPECT_EQ(type_kernels(DType::kQ3_K)->act_type, DType::kQ8_K);
  EXPECT_EQ(type_kernels(DType::kIQ4_NL)->act_type, DType::kQ8_0);
  EXPECT_EQ(type_kernels(DType::kIQ4_XS)->act_type, DType::kQ8_K);
  EXPECT_EQ(type_kernels(DType::kQ8_0)->act_type, DType::kQ8_0);
  EXPECT_EQ(type_kernels(DType::kQ4_0)->act_type, DType::kQ8_0);
  EXPECT_EQ(type_kernels(DType::kQ5_0)->act_type, DType::kQ8_0);
  EXPECT_EQ(type_kernels(DType::kQ4_1)->act_type, DType::kQ8_1);
  EXPECT_EQ(type_kernels(DType::kQ5_1)->act_type, DType::kQ8_1);
  EXPECT_EQ(type_kernels(DType::kQ4_K)->act_type, DType::kQ8_K);
  EXPECT_EQ(type_kernels(DType::kQ6_K)->act_type, DType::kQ8_K);
  EXPECT_EQ(type_kernels(DType::kBF16)->act_type, DType::kF32);
}

// The matmul order is llama.cpp's out-of-the-box one unless the environment asks for the other (this test binary
// runs with INFERD_MATMUL_ORDER unset in CI; a set one must parse, or the default stays).
TEST(Dispatch, MatmulOrderDefaultsToRepacked) {
  const char* env = std::getenv("INFERD_MATMUL_ORDER");
  MatmulOrder from_env = MatmulOrder::kRepacked;
  if (env != nullptr) parse_matmul_order(env, &from_env);
  EXPECT_EQ(matmul_order(), from_env) << (env != nullptr ? env : "(unset)");
  // Repacked kernels exist for the two types the order changes, the others keep their vec_dot kernels.
  EXPECT_NE(type_kernels(DType::kQ4_0, best_isa(), MatmulOrder::kRepacked), type_kernels(DType::kQ4_0, best_isa()));
  EXPECT_NE(type_kernels(DType::kQ4_K, best_isa(), MatmulOrder::kRepacked), type_kernels(DType::kQ4_K, best_isa()));
  EXPECT_EQ(type_kernels(DType::kQ6_K, best_isa(), MatmulOrder::kRepacked), type_kernels(DType::kQ6_K, best_isa()));
}

// ---- fp16 / bf16 --------------------------------------------------------------------------

TEST(Fp16, KnownBitPatterns) {
  struct Case {
    float f;
    uint16_t h;
  };
  const Case cases[] = {
      {0.0f, 0x0000},          {-0.0f, 0x8000},           {1.0f, 0x3c00},
      {-2.0f, 0xc000},         {65504.0f, 0x7bff},        {INFINITY, 0x7c00},
      {-INFINITY, 0xfc00},     {0x1p-24f, 0x0001},        {0x1p-14f, 0x0400},
      {1023 * 0x1p-24f, 0x03ff}, {-0x1p-24f, 0x8001},     {0.333251953125f, 0x3555},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(fp32_to_fp16(c.f), c.h) << c.f;
    const float back = fp16_to_fp32(c.h);
    EXPECT_EQ(float_to_bits(back), float_to_bits(c.f)) << std::hex << c.h;
  }
  // Rounding: ties to even, overflow to infinity, underflow to zero.
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f), 0x3c00);            // tie, even stays
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);        // tie, odd rounds up
  EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(1e10f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(0x1p-25f), 0x0000);                   // tie to even (zero)
  EXPECT_EQ(fp32_to_fp16(0x1.8p-25f), 0x0001);
  EXPECT_EQ(fp32_to_fp16(3 * 0x1p-25f), 0x0002);               // tie, odd rounds up
  EXPECT_EQ(fp32_to_fp16(1e-30f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(2047 * 0x1p-25f), 0x0400);            // rounds up into the normals
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7e00)));
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7c01)));
  const uint16_t nan_h = fp32_to_fp16(std::nanf(""));
  EXPECT_EQ(nan_h & 0x7c00, 0x7c00);
  EXPECT_NE(nan_h & 0x03ff, 0);
}

TEST(Fp16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    const float want = half_value(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << h;
      ASSERT_EQ(fp32_to_fp16(f) | 0x0200, h | 0x0200) << h;  // payload kept, made quiet
    } else {
      ASSERT_EQ(float_to_bits(f), float_to_bits(want)) << h;
      ASSERT_EQ(fp32_to_fp16(f), h) << h;
    }
  }
}

TEST(Fp16, RowConversionsMatchScalarOnEveryIsa) {
  std::mt19937 rng(7);
  std::vector<float> src;
  for (int i = 0; i < 4000; ++i) {
    // Exponents from deep subnormal to overflow, random mantissas, both signs.
    src.push_back(bits_to_float((rng() & 0x80000000u) | ((90u + rng() % 60u) << 23) | (rng() & 0x7fffff)));
  }
  src.insert(src.end(), {0.0f, -0.0f, INFINITY, -INFINITY, 0x1p-25f, 65520.0f, std::nanf("")});
  for (Isa isa : kAllIsas) {
    if (!isa_available(isa)) continue;
    const VectorKernels& vk = vector_kernels(isa);
    for (int64_t n : {1, 7, 17, 100, static_cast<int>(src.size())}) {
      std::vector<fp16_t> h(n + 1, 0xABCD);
      vk.fp32_to_fp16_row(src.data(), h.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(h[i], fp32_to_fp16(src[i])) << isa_name(isa) << " " << src[i];
      EXPECT_EQ(h[n], 0xABCD) << "wrote past the end";
      std::vector<float> back(n + 1, 42.0f);
      vk.fp16_to_fp32_row(h.data(), back.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const float want = fp16_to_fp32(h[i]);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(back[i]));
        } else {
          ASSERT_EQ(float_to_bits(back[i]), float_to_bits(want)) << isa_name(isa);
        }
      }
      EXPECT_EQ(back[n], 42.0f);
    }
  }
}

TEST(Bf16, Decodes) {
  EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_fp32(0xc000), -2.0f);
  EXPECT_EQ(float_to_bits(bf16_to_fp32(0x8000)), 0x80000000u);
  EXPECT_TRUE(std::isinf(bf16_to_fp32(0x7f80)));
  EXPECT_TRUE(std::isnan(bf16_to_fp32(0x7fc0)));
}

// ---- Dequantization -------------------------------------------------------------------------

TEST(Dequantize, HandMadeBlocks) {
  BlockQ4_0 q40{};
  q40.d = fp32_to_fp16(0.5f);
  q40.qs[0] = 0x2F;  // element 0: 15 - 8 = 7; element 16: 2 - 8 = -6
  q40.qs[15] = 0x80;  // element 15: -8; element 31: 0
  float out[256];
  type_kernels(DType::kQ4_0, Isa::kScalar)->to_float(&q40, out, 32);
  EXPECT_EQ(out[0], 3.5f);
  EXPECT_EQ(out[16], -3.0f);
  EXPECT_EQ(out[15], -4.0f);
  EXPECT_EQ(out[31], 0.0f);
  EXPECT_EQ(out[1], -4.0f);

  BlockQ4_1 q41{};
  q41.d = fp32_to_fp16(2.0f);
  q41.m = fp32_to_fp16(-1.0f);
  q41.qs[3] = 0x51;  // element 3: 1*2-1 = 1; element 19: 5*2-1 = 9
  type_kernels(DType::kQ4_1, Isa::kScalar)->to_float(&q41, out, 32);
  EXPECT_EQ(out[3], 1.0f);
  EXPECT_EQ(out[19], 9.0f);
  EXPECT_EQ(out[0], -1.0f);

  BlockQ5_0 q50{};
  q50.d = fp32_to_fp16(1.0f);
  q50.qh[0] = 0x01;  // element 0 high bit
  q50.qh[2] = 0x02;  // element 17 high bit
  q50.qs[0] = 0x03;  // element 0: (3|16)-16 = 3; element 16: 0-16 = -16
  q50.qs[1] = 0x40;  // element 1: -16; element 17: (4|16)-16 = 4
  type_kernels(DType::kQ5_0, Isa::kScalar)->to_float(&q50, out, 32);
  EXPECT_EQ(out[0], 3.0f);
  EXPECT_EQ(out[16], -16.0f);
  EXPECT_EQ(out[1], -16.0f);
  EXPECT_EQ(out[17], 4.0f);

  BlockQ8_0 q80{};
  q80.d = fp32_to_fp16(0.25f);
  q80.qs[5] = -128;
  q80.qs[6] = 127;
  type_kernels(DType::kQ8_0, Isa::kScalar)->to_float(&q80, out, 32);
  EXPECT_EQ(out[5], -32.0f);
  EXPECT_EQ(out[6], 31.75f);

  BlockQ4_K q4k{};
  q4k.d = fp32_to_fp16(1.0f);
  q4k.dmin = fp32_to_fp16(0.5f);
  q4k.scales[0] = 3;          // sub-block 0 scale 3
  q4k.scales[4] = 2;          // sub-block 0 min 2
  q4k.scales[8] = 0x75;       // sub-block 4: scale 5 | (scales[0]>>6)<<4, min 7 | (scales[4]>>6)<<4
  q4k.scales[0] |= 0x40;      // adds 16 to sub-block 4's scale; sub-block 0 keeps 3
  q4k.qs[0] = 0x9A;           // element 0: 10; element 32 (sub-block 1, scale 0): 9
  q4k.qs[64] = 0x04;          // element 128 (sub-block 4): 4
  type_kernels(DType::kQ4_K, Isa::kScalar)->to_float(&q4k, out, 256);
  EXPECT_EQ(out[0], 3.0f * 10 - 0.5f * 2);
  EXPECT_EQ(out[32], 0.0f);
  EXPECT_EQ(out[128], 21.0f * 4 - 0.5f * 7);

  BlockQ6_K q6k{};
  q6k.d = fp32_to_fp16(0.5f);
  q6k.scales[0] = -2;
  q6k.scales[6] = 4;          // group 6 = elements 96..111
  q6k.ql[0] = 0x0F;           // element 0 low 4 bits 15; element 64 low bits 0
  q6k.qh[0] = 0xC3;           // element 0 high 3 -> 63-32 = 31; element 96 high 3
  q6k.ql[32] = 0x50;          // element 96 low bits 5 -> (5|48)-32 = 21
  type_kernels(DType::kQ6_K, Isa::kScalar)->to_float(&q6k, out, 256);
  EXPECT_EQ(out[0], 0.5f * -2 * 31);
  EXPECT_EQ(out[96], 0.5f * 4 * 21);
  EXPECT_EQ(out[1], 0.5f * -2 * -32);
}

TEST(Dequantize, MatchesIndependentDecoderOnEveryIsa) {
  std::mt19937 rng(1);
  for (DType t : kWeightTypes) {
    const int64_t bs = dtype_info(t)->block_size;
    const int64_t n = bs == 1 ? 257 : bs * 5;
    const std::vector<uint8_t> row = random_weights(rng, t, n);
    for (Isa isa : kAllIsas) {
      if (!isa_available(isa)) continue;
      std::vector<float> out(n + 1, 42.0f);
      type_kernels(t, isa)->to_float(row.data(), out.data(), n);
      for (int64_t e = 0; e < n; ++e) {
        ASSERT_EQ(out[e], reference_element(t, row.data(), e)) << dtype_name(t) << " element " << e;
      }
      EXPECT_EQ(out[n], 42.0f);
    }
  }
}

// ---- Reference quantizers -------------------------------------------------------------------

TEST(QuantizeRef, RoundTripsWithinHalfAStep) {
  std::mt19937 rng(3);
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1}) {
    ASSERT_TRUE(has_quantize_ref(t));
    const int64_t n = 32 * 9;
    std::vector<float> x = random_floats(rng, n);
    std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // an all-zero block
    std::vector<uint8_t> q(dtype_row_bytes(t, n));
    quantize_row_ref(t, x.data(), q.data(), n);
    std::vector<float> y(n);
    type_kernels(t, Isa::kScalar)->to_float(q.data(), y.data(), n);
    for (int64_t b = 0; b < n / 32; ++b) {
      float lo = x[b * 32], hi = x[b * 32], amax = 0.0f;
      for (int j = 0; j < 32; ++j) {
        lo = std::min(lo, x[b * 32 + j]);
        hi = std::max(hi, x[b * 32 + j]);
        amax = std::max(amax, std::fabs(x[b * 32 + j]));
      }
      // The step of each type; the clamped top code of Q4_0/Q5_0 may be a whole step off;
      // the fp16 scale and min add relative errors of 2^-11.
      float step = 0.0f, slack = 0.5f;
      switch (t) {
        case DType::kQ8_0: step = amax / 127; break;
        case DType::kQ4_0: step = amax / 8; slack = 1.0f; break;
        case DType::kQ5_0: step = amax / 16; slack = 1.0f; break;
        case DType::kQ4_1: step = (hi - lo) / 15; break;
        case DType::kQ5_1: step = (hi - lo) / 31; break;
        default: break;
      }
      const float tol = slack * step + 2 * amax * 0x1p-11f + 1e-7f;
      for (int j = 0; j < 32; ++j) {
        ASSERT_NEAR(y[b * 32 + j], x[b * 32 + j], tol) << dtype_name(t) << " block " << b << " j " << j;
      }
    }
  }
  EXPECT_FALSE(has_quantize_ref(DType::kQ4_K));
}

// Weights use ggml's quantize_row_q8_0_ref (1/d, ties away from zero); activations use ggml's x86
// quantize_row_q8_0 (127/amax, ties to even). The two agree within one quant step.
TEST(QuantizeRef, Q8_0WithinOneStepOfActivationQuantizer) {
  std::mt19937 rng(4);
  const std::vector<float> x = random_floats(rng, 32 * 5);
  std::vector<uint8_t> a(dtype_row_bytes(DType::kQ8_0, 160)), b(a.size());
  quantize_row_ref(DType::kQ8_0, x.data(), a.data(), 160);
  type_kernels(DType::kQ4_0)->quantize_act(x.data(), b.data(), 160);
  const auto* qa = reinterpret_cast<const BlockQ8_0*>(a.data());
  const auto* qb = reinterpret_cast<const BlockQ8_0*>(b.data());
  for (int blk = 0; blk < 5; ++blk) {
    EXPECT_EQ(qa[blk].d, qb[blk].d);
    for (int j = 0; j < 32; ++j) EXPECT_LE(std::abs(qa[blk].qs[j] - qb[blk].qs[j]), 1) << blk << " " << j;
  }
}

// ---- Activation quantization: test-local references of ggml's x86 quantize_row_q8_0 / q8_1 ---
// (the AVX path llama.cpp runs: multiplier 127 / amax, ties to even) and of quantize_row_q8_K_ref.

void local_q8_0(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    y[b].d = fp32_to_fp16(amax / 127.0f);
    for (int j = 0; j < 32; ++j) y[b].qs[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
  }
}

void local_q8_1(const float* x, BlockQ8_1* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      y[b].qs[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
      sum += y[b].qs[j];
    }
    y[b].d = fp32_to_fp16(d);
    y[b].s = fp32_to_fp16(d * static_cast<float>(sum));
  }
}

void local_q8_k(const float* x, BlockQ8_K* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 256) {
    std::memset(&y[b], 0, sizeof(y[b]));
    int arg = 0;
    for (int j = 1; j < 256; ++j) {
      if (std::fabs(x[j]) > std::fabs(x[arg])) arg = j;
    }
    if (x[arg] == 0.0f) continue;
    const float iscale = -127.0f / x[arg];
    for (int j = 0; j < 256; ++j) {
      const float v = std::nearbyint(iscale * x[j]);  // default mode: ties to even
      y[b].qs[j] = static_cast<int8_t>(std::min(127.0f, v));
      y[b].bsums[j / 16] = static_cast<int16_t>(y[b].bsums[j / 16] + y[b].qs[j]);
    }
    y[b].d = 1.0f / iscale;
  }
}

std::vector<float> activation_data(std::mt19937& rng, int64_t n) {
  std::vector<float> x = random_floats(rng, n);
  std::fill(x.begin(), x.begin() + 32, 0.0f);  // an all-zero block
  // A block whose scale is exactly 1, with ties at .5 (both quantizers round them to even).
  if (n >= 512) {
    for (int j = 256; j < 512; ++j) x[j] = static_cast<float>((j % 7) - 3) + 0.5f;
    x[256] = -127.0f;
  }
  return x;
}

TEST(QuantizeAct, MatchesGgmlReferenceOnEveryIsa) {
  std::mt19937 rng(5);
  const int64_t n = 256 * 3;
  const std::vector<float> x = activation_data(rng, n);
  std::vector<BlockQ8_0> w0(n / 32);
  std::vector<BlockQ8_1> w1(n / 32);
  std::vector<BlockQ8_K> wk(n / 256);
  local_q8_0(x.data(), w0.data(), n / 32);
  local_q8_1(x.data(), w1.data(), n / 32);
  local_q8_k(x.data(), wk.data(), n / 256);
  EXPECT_EQ(wk[1].qs[1], 2);  // 2.5 * (-127 / -127) -> 2 (ties to even)
  EXPECT_EQ(w0[8].qs[1], 2);  // 2.5 with d = 1 -> 2 (ties to even, as _mm256_round_ps)
  for (Isa isa : kAllIsas) {
    if (!isa_available(isa)) continue;
    for (DType t : kWeightTypes) {
      const TypeKernels* k = type_kernels(t, isa);
      std::vector<uint8_t> got(dtype_row_bytes(k->act_type, n) + 1, 0xEE);
      k->quantize_act(x.data(), got.data(), n);
      EXPECT_EQ(got.back(), 0xEE);
      const void* want = x.data();
      switch (k->act_type) {
        case DType::kQ8_0: want = w0.data(); break;
        case DType::kQ8_1: want = w1.data(); break;
        case DType::kQ8_K: want = wk.data(); break;
        default: break;
      }
      EXPECT_EQ(std::memcmp(got.data(), want, got.size() - 1), 0) << dtype_name(t) << " " << isa_name(isa);
    }
  }
}

// Q8_K takes its scale from the first element of largest magnitude, sign included: a tie between -m and
// +m is decided by position, on every ISA.
TEST(QuantizeAct, Q8KScaleSignComesFromTheFirstLargestElement) {
  for (const bool negative_first : {true, false}) {
    std::vector<float> x(256, 0.25f);
    x[3] = negative_first ? -5.0f : 5.0f;
    x[200] = negative_first ? 5.0f : -5.0f;
    const TypeKernels* ref = type_kernels(DType::kQ4_K, Isa::kScalar);
    BlockQ8_K want;
    ref->quantize_act(x.data(), &want, 256);
    EXPECT_EQ(want.d < 0.0f, !negative_first);  // d = max / -127
    for (Isa isa : kAllIsas) {
      if (!isa_available(isa)) continue;
      BlockQ8_K got;
      type_kernels(DType::kQ4_K, isa)->quantize_act(x.data(), &got, 256);
      EXPECT_EQ(std::memcmp(&got, &want, sizeof(got)), 0) << isa_name(isa) << " negative_first " << negative_first;
    }
  }
}

// ---- dot ------------------------------------------------------------------------------------

// Dequantized activations (test-local) for the tolerance bound.
std::vector<float> dequant_act(DType act_type, const uint8_t* a, int64_t n) {
  std::vector<float> out(n);
  for (int64_t e = 0; e < n; ++e) {
    switch (act_type) {
      case DType::kF32: std::memcpy(&out[e], a + 4 * e, 4); break;
      case DType::kQ8_0: {
        const auto& b = reinterpret_cast<const BlockQ8_0*>(a)[e / 32];
        out[e] = half_value(b.d) * b.qs[e % 32];
        break;
      }
      case DType::kQ8_1: {
        const auto& b = reinterpret_cast<const BlockQ8_1*>(a)[e / 32];
        out[e] = half_value(b.d) * b.qs[e % 32];
        break;
      }
      case DType::kQ8_K: {
        const auto& b = reinterpret_cast<const BlockQ8_K*>(a)[e / 256];
        out[e] = b.d * b.qs[e % 256];
        break;
      }
      default: ADD_FAILURE();
    }
  }
  return out;
}

TEST(Dot, EveryTypeIsaAndRowCountMatchesScalar) {
  std::mt19937 rng(11);
  for (DType t : kWeightTypes) {
    const int64_t bs = dtype_info(t)->block_size;
    std::vector<int64_t> sizes;
    if (bs == 1) sizes = {1, 7, 17, 100, 257};
    if (bs == 32) sizes = {32, 96, 224, 1056};
    if (bs == 256) sizes = {256, 768, 1280};
    for (int64_t k : sizes) {
      const std::vector<uint8_t> w = random_weights(rng, t, k);
      const TypeKernels* ref = type_kernels(t, Isa::kScalar);
      const size_t act_bytes = dtype_row_bytes(ref->act_type, k);
      const size_t stride = act_bytes + 8;  // rows not packed back to back
      std::vector<uint8_t> act(stride * kMaxDotRows);
      std::vector<float> w_f(k);
      ref->to_float(w.data(), w_f.data(), k);
      float w_max = 0.0f;
      for (float v : w_f) w_max = std::max(w_max, std::fabs(v));
      float bound[kMaxDotRows];
      for (int r = 0; r < kMaxDotRows; ++r) {
        const std::vector<float> x = random_floats(rng, k, r == 3 ? 10.0f : 1.0f);
        ref->quantize_act(x.data(), act.data() + r * stride, k);
        const std::vector<float> a = dequant_act(ref->act_type, act.data() + r * stride, k);
        float s = 0.0f;
        for (float v : a) s += std::fabs(v);
        bound[r] = 2.0f * w_max * s;
      }
      for (int nr = 1; nr <= kMaxDotRows; ++nr) {
        float want[kMaxDotRows + 1];
        ref->dot(k, w.data(), act.data(), stride, nr, want);
        // The scalar reference itself against the dequantized float dot (a looser, independent check).
        for (int r = 0; r < nr; ++r) {
          const std::vector<float> a = dequant_act(ref->act_type, act.data() + r * stride, k);
          double exact = 0.0;
          for (int64_t e = 0; e < k; ++e) exact += static_cast<double>(reference_element(t, w.data(), e)) * a[e];
          ASSERT_NEAR(want[r], exact, 1e-4 * bound[r] + 1e-6) << dtype_name(t) << " k " << k << " row " << r;
        }
        for (Isa isa : kAllIsas) {
          if (!isa_available(isa)) continue;
          float got[kMaxDotRows + 1];
          std::fill(std::begin(got), std::end(got), 42.0f);
          type_kernels(t, isa)->dot(k, w.data(), act.data(), stride, nr, got);
          for (int r = 0; r < nr; ++r) {
            ASSERT_NEAR(got[r], want[r], 1e-5 * bound[r] + 1e-6)
                << dtype_name(t) << " " << isa_name(isa) << " k " << k << " nr " << nr << " row " << r;
          }
          EXPECT_EQ(got[nr], 42.0f) << "wrote past out[nr]";
        }
      }
    }
  }
}

// Weights at the edges of their ranges (Q8_0's -128, all-ones nibbles) against saturated activations.
TEST(Dot, ExtremeQuantsMatchScalar) {
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ4_K,
                  DType::kQ5_K, DType::kQ6_K, DType::kQ2_K, DType::kQ3_K, DType::kIQ4_NL, DType::kIQ4_XS}) {
    const int64_t k = dtype_info(t)->block_size * 3;
    for (uint8_t fill : {0x00, 0x80, 0xFF}) {
      std::mt19937 rng(fill);
      std::vector<uint8_t> w = random_weights(rng, t, k);
      // Keep the scales random, overwrite every quant byte.
      const DTypeInfo* info = dtype_info(t);
      for (int64_t b = 0; b < k / info->block_size; ++b) {
        uint8_t* blk = w.data() + b * info->block_bytes;
        switch (t) {
          case DType::kQ8_0: std::memset(blk + 2, fill, 32); break;
          case DType::kQ4_0: std::memset(blk + 2, fill, 16); break;
          case DType::kQ4_1: std::memset(blk + 4, fill, 16); break;
          case DType::kQ5_0: std::memset(blk + 2, fill, 20); break;
          case DType::kQ5_1: std::memset(blk + 4, fill, 20); break;
          case DType::kQ4_K: std::memset(blk + 4, fill, 140); break;
          case DType::kQ5_K: std::memset(blk + 4, fill, 172); break;
          case DType::kQ6_K: std::memset(blk, fill, 208); break;
          case DType::kQ2_K: std::memset(blk + 16, fill, 64); break;
          case DType::kQ3_K: std::memset(blk, fill, 96); break;
          case DType::kIQ4_NL: std::memset(blk + 2, fill, 16); break;
          case DType::kIQ4_XS: std::memset(blk + 8, fill, 128); break;
          default: break;
        }
      }
      std::vector<float> x(k);
      for (int64_t e = 0; e < k; ++e) x[e] = (e % 2) ? 1.0f : -1.0f;
      const TypeKernels* ref = type_kernels(t, Isa::kScalar);
      std::vector<uint8_t> act(dtype_row_bytes(ref->act_type, k));
      ref->quantize_act(x.data(), act.data(), k);
      float want = 0.0f;
      ref->dot(k, w.data(), act.data(), act.size(), 1, &want);
      for (Isa isa : kAllIsas) {
        if (!isa_available(isa)) continue;
        float got = 0.0f;
        type_kernels(t, isa)->dot(k, w.data(), act.data(), act.size(), 1, &got);
        EXPECT_NEAR(got, want, 1e-5 * std::fabs(want) + 1e-5) << dtype_name(t) << " " << isa_name(isa);
      }
    }
  }
}

// ---- Vector helpers -------------------------------------------------------------------------

// The SIMD dot kernels reproduce ggml's AVX2 vec_dot order, so each row of an nr-row call equals the
// single-row result and AVX2 equals AVX-512 bit for bit (maddubs/madd vs VNNI: same integer sums).
TEST(Dot, SimdRowsAndIsasAreBitIdentical) {
  std::mt19937 rng(21);
  for (DType t : kWeightTypes) {
    const int64_t bs = dtype_info(t)->block_size;
    if (bs == 1) continue;
    const int64_t k = bs == 32 ? 1056 : 1280;
    const std::vector<uint8_t> w = random_weights(rng, t, k);
    const TypeKernels* ref = type_kernels(t, Isa::kScalar);
    const size_t stride = dtype_row_bytes(ref->act_type, k);
    std::vector<uint8_t> act(stride * kMaxDotRows);
    for (int r = 0; r < kMaxDotRows; ++r) {
      const std::vector<float> x = random_floats(rng, k, r == 3 ? 10.0f : 1.0f);
      ref->quantize_act(x.data(), act.data() + r * stride, k);
    }
    float first[kMaxDotRows] = {};
    bool have_first = false;
    for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
      if (!isa_available(isa)) continue;
      const TypeKernels* tk = type_kernels(t, isa);
      float single[kMaxDotRows];
      for (int r = 0; r < kMaxDotRows; ++r) tk->dot(k, w.data(), act.data() + r * stride, stride, 1, &single[r]);
      for (int nr = 2; nr <= kMaxDotRows; ++nr) {
        float got[kMaxDotRows];
        tk->dot(k, w.data(), act.data(), stride, nr, got);
        for (int r = 0; r < nr; ++r) {
          EXPECT_EQ(std::memcmp(&got[r], &single[r], 4), 0) << dtype_name(t) << " " << isa_name(isa) << " nr " << nr;
        }
      }
      if (have_first) {
        EXPECT_EQ(std::memcmp(first, single, sizeof(single)), 0) << dtype_name(t) << " avx2 vs avx512";
      }
      std::memcpy(first, single, sizeof(single));
      have_first = true;
    }
  }
}

// ---- ggml's transcendental row operations ----------------------------------------------------

float ulp_distance(float a, float b) {
  return std::fabs(a - b) / std::max(std::numeric_limits<float>::denorm_min(), std::fabs(std::nextafter(b, INFINITY) - b));
}

// exp over its whole range (underflow, subnormal results, overflow), densely: every ISA's vector exp (inside
// exp_sum and swiglu) gives the scalar lanes' bits in both orders.
TEST(GgmlMath, ExpAndSwigluAreBitIdenticalOnEveryIsaAcrossTheRange) {
  const int64_t n = 1 << 18;
  std::vector<float> x(n), u(n, 1.0f);
  for (int64_t i = 0; i < n; ++i) x[i] = -110.0f + 205.0f * static_cast<float>(i) / static_cast<float>(n);
  for (GgmlOrder order : {GgmlOrder::kAvx512, GgmlOrder::kAvx2}) {
    SCOPED_TRACE(ggml_order_name(order));
    const VectorKernels& ref = vector_kernels(Isa::kScalar, order);
    std::vector<float> want_exp(n), want_swiglu(n), got(n);
    const double want_sum = ref.exp_sum(n, x.data(), 0.0f, want_exp.data());
    ref.swiglu(n, x.data(), u.data(), want_swiglu.data());
    for (Isa isa : kAllIsas) {
      if (!isa_available(isa) || isa == Isa::kScalar) continue;
      const VectorKernels& vk = vector_kernels(isa, order);
      EXPECT_EQ(vk.exp_sum(n, x.data(), 0.0f, got.data()), want_sum) << isa_name(isa);
      int64_t differ = 0;
      for (int64_t i = 0; i < n; ++i) differ += std::memcmp(&got[i], &want_exp[i], 4) != 0;
      EXPECT_EQ(differ, 0) << isa_name(isa) << " exp";
      vk.swiglu(n, x.data(), u.data(), got.data());
      differ = 0;
      for (int64_t i = 0; i < n; ++i) differ += std::memcmp(&got[i], &want_swiglu[i], 4) != 0;
      EXPECT_EQ(differ, 0) << isa_name(isa) << " swiglu";
    }
  }
}

// In both float orders (llama.cpp's AVX-512 and AVX2 builds): every ISA gives the scalar lanes' bits.
TEST(GgmlMath, ExpSiluSwigluRopeAreBitIdenticalOnEveryIsa) {
  for (GgmlOrder order : {GgmlOrder::kAvx512, GgmlOrder::kAvx2}) {
    SCOPED_TRACE(ggml_order_name(order));
    std::mt19937 rng(17);
    const int64_t n = 16 * 9 + 5;  // whole chunks and a partial one
    std::vector<float> x = random_floats(rng, n, 30.0f), u = random_floats(rng, n);
    x[0] = 0.0f;
    x[1] = -200.0f;  // exp underflows to 0, silu to -0
    x[2] = 100.0f;   // exp overflows to inf
    x[3] = -87.0f;   // subnormal exp
    // Around the AVX2 kernels' switch to the lanes' ldexp (|n| > 126) and into the subnormal range.
    const float edges[] = {-86.5f, -87.4f, -87.35f, -88.0f, -88.7f, -89.5f, -95.0f, -100.0f, -103.0f, -103.9f,
                           -104.0f, -104.5f, -86.0f, 86.5f, 87.35f, 87.4f, 88.0f, 88.5f, 88.8f, 89.0f, -0.0f, 1e-30f, -1e-30f};
    for (size_t e = 0; e < std::size(edges); ++e) x[4 + 16 * e % (n - 4)] = edges[e];
    const VectorKernels& ref = vector_kernels(Isa::kScalar, order);
    std::vector<float> want_swiglu(n), want_exp(n);
    ref.swiglu(n, x.data(), u.data(), want_swiglu.data());
    const double want_sum = ref.exp_sum(n, x.data(), 1.5f, want_exp.data());
    std::vector<float> c = random_floats(rng, 32), sn = random_floats(rng, 32), want_rope = random_floats(rng, 64);
    std::vector<float> rope_in = want_rope;
    ref.rope_rotate(32, c.data(), sn.data(), want_rope.data(), want_rope.data() + 1, 2);
    for (int64_t i = 0; i < n; ++i) {
      const double e = std::exp(static_cast<double>(x[i] - 1.5f));  // the argument exp_sum rounds to
      if (e < 1e-38) {
        EXPECT_LE(want_exp[i], 1.2e-38f) << x[i];
      } else if (e > 3.4e38) {
        EXPECT_EQ(want_exp[i], INFINITY) << x[i];
      } else {
        EXPECT_LE(ulp_distance(want_exp[i], static_cast<float>(e)), 2.0f) << x[i];
      }
      EXPECT_EQ(std::memcmp(&want_swiglu[i], &(const float&)(ref.silu(x[i]) * u[i]), 4), 0);
    }
    EXPECT_EQ(ref.silu(-200.0f), -0.0f);
    EXPECT_EQ(ref.silu(0.0f), 0.0f);
    for (Isa isa : kAllIsas) {
      if (!isa_available(isa)) continue;
      const VectorKernels& vk = vector_kernels(isa, order);
      std::vector<float> got(n + 1, 42.0f);
      vk.swiglu(n, x.data(), u.data(), got.data());
      EXPECT_EQ(std::memcmp(got.data(), want_swiglu.data(), 4 * n), 0) << isa_name(isa);
      EXPECT_EQ(got[n], 42.0f);
      const double sum = vk.exp_sum(n, x.data(), 1.5f, got.data());
      EXPECT_EQ(std::memcmp(got.data(), want_exp.data(), 4 * n), 0) << isa_name(isa);
      EXPECT_EQ(got[n], 42.0f);
      EXPECT_EQ(sum, want_sum) << isa_name(isa);
      for (int64_t i = 0; i < n; ++i) {
        const float s = vk.silu(x[i]);
        EXPECT_EQ(std::memcmp(&s, &(const float&)ref.silu(x[i]), 4), 0) << isa_name(isa) << " " << x[i];
      }
      std::vector<float> r = rope_in;
      vk.rope_rotate(32, c.data(), sn.data(), r.data(), r.data() + 1, 2);
      EXPECT_EQ(std::memcmp(r.data(), want_rope.data(), 4 * 64), 0) << isa_name(isa);
    }
  }
}

// The two orders are different functions: ggml_v_expf's AVX2 variant rounds its last step differently
// (fma(j, 2^n, 2^n) against scalef(j + 1, n)), exp_sum reduces chunks of 8 against 16, and attention's KQV
// keeps 8 lanes against 16.
TEST(GgmlMath, Avx2OrderDiffersFromAvx512Order) {
  std::mt19937 rng(19);
  const VectorKernels& a512 = vector_kernels(Isa::kScalar, GgmlOrder::kAvx512);
  const VectorKernels& a2 = vector_kernels(Isa::kScalar, GgmlOrder::kAvx2);
  const int64_t n = 4096;
  const std::vector<float> x = random_floats(rng, n, 10.0f);
  std::vector<float> y512(n), y2(n);
  a512.exp_sum(n, x.data(), 0.0f, y512.data());
  a2.exp_sum(n, x.data(), 0.0f, y2.data());
  int differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    differ += y512[i] != y2[i];
    EXPECT_LE(ulp_distance(y2[i], y512[i]), 1.0f) << x[i];
  }
  EXPECT_GT(differ, 0) << "the AVX2 variant of ggml_v_expf rounds differently somewhere";
  EXPECT_LT(differ, n / 2);
  // Chunks of 8: 1 then 7 copies of 2^-24 sum to 1 + 7 * 2^-24 pairwise-first in an 8-lane reduction.
  std::vector<float> t(8, std::log(0x1p-24f)), e(8);
  t[0] = 0.0f;
  const double s8 = a2.exp_sum(8, t.data(), 0.0f, e.data());
  float c[4];
  for (int i = 0; i < 4; ++i) c[i] = e[i + 4] + e[i];
  EXPECT_EQ(s8, static_cast<double>((c[0] + c[2]) + (c[1] + c[3])));
  // KQV chains: position j goes to lane j mod 8 (AVX2 order) or j mod 16.
  std::vector<fp16_t> v(4 * 16);
  for (auto& h : v) h = fp32_to_fp16(1.0f);
  const float w[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  for (GgmlOrder order : {GgmlOrder::kAvx512, GgmlOrder::kAvx2}) {
    std::vector<float> lanes(16 * 4, 0.0f);
    vector_kernels(Isa::kScalar, order).axpy_f16_rows(4, w, v.data(), 4, 16, 3, lanes.data(), 4);
    const int L = order == GgmlOrder::kAvx2 ? 8 : 16;
    for (int lane = 0; lane < 16; ++lane) EXPECT_EQ(lanes[lane * 4], lane < L ? 16.0f / L : 0.0f) << lane;
  }
}

// tinyBLAS's F16 dot in the AVX2 order: one 8-lane accumulator (lane i: elements i mod 8, fused), its
// horizontal sum, then the scale.
TEST(VectorHelpers, Avx2OrderRowDotsAreTinyBlasAvx2) {
  std::mt19937 rng(29);
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_available(isa)) continue;
    const VectorKernels& vk = vector_kernels(isa, GgmlOrder::kAvx2);
    for (int64_t n : {8, 64, 256}) {
      const std::vector<float> x = random_floats(rng, n);
      std::vector<fp16_t> y(3 * n);
      const std::vector<float> yf = random_floats(rng, 3 * n);
      fp32_to_fp16_row(yf.data(), y.data(), 3 * n);
      float got[3];
      vk.dot_f32_f16_rows(n, x.data(), y.data(), n, 3, 0.125f, got);
      for (int r = 0; r < 3; ++r) {
        float acc[8] = {};
        for (int64_t i = 0; i < n; ++i) acc[i % 8] = std::fma(x[i], fp16_to_fp32(y[r * n + i]), acc[i % 8]);
        float c[4];
        for (int i = 0; i < 4; ++i) c[i] = acc[i + 4] + acc[i];
        const float want = ((c[0] + c[2]) + (c[1] + c[3])) * 0.125f;
        EXPECT_EQ(std::memcmp(&got[r], &want, 4), 0) << isa_name(isa) << " n " << n << " row " << r;
      }
    }
  }
}

TEST(GgmlMath, ExpSumReducesChunksInReduceAddOrder) {
  // Values whose float sum depends on the order: 1, then 15 copies of 2^-24 (each lost when added to
  // 1 on its own, kept when added pairwise first).
  std::vector<float> x(17, std::log(0x1p-24f));
  x[0] = 0.0f;
  x[16] = 0.0f;  // second chunk: 1 and 15 zero-padded lanes
  std::vector<float> y(17);
  const double sum = exp_sum(17, x.data(), 0.0f, y.data());
  float chunk[16];
  for (int i = 0; i < 16; ++i) chunk[i] = y[i];
  float a[8], b[4];
  for (int i = 0; i < 8; ++i) a[i] = chunk[i + 8] + chunk[i];
  for (int i = 0; i < 4; ++i) b[i] = a[i + 4] + a[i];
  const float first = (b[0] + b[2]) + (b[1] + b[3]);
  EXPECT_EQ(sum, static_cast<double>(first) + static_cast<double>(y[16]));
  EXPECT_EQ(y[16], 1.0f);
}

TEST(VectorHelpers, MatchScalarOnEveryIsa) {
  std::mt19937 rng(13);
  const VectorKernels& ref = vector_kernels(Isa::kScalar);
  for (int64_t n : {0, 1, 7, 17, 100, 1000}) {
    const std::vector<float> x = random_floats(rng, n), y = random_floats(rng, n);
    std::vector<fp16_t> h(n);
    ref.fp32_to_fp16_row(y.data(), h.data(), n);
    float bound_f16 = 1e-6f, bound_f32 = 1e-6f;
    for (int64_t i = 0; i < n; ++i) {
      bound_f16 += 1e-5f * std::fabs(x[i] * fp16_to_fp32(h[i]));
      bound_f32 += 1e-5f * std::fabs(x[i] * y[i]);
    }
    const float want_f16 = ref.dot_f32_f16(n, x.data(), h.data());
    const float want_f32 = ref.dot_f32(n, x.data(), y.data());
    std::vector<float> want_axpy = y;
    ref.axpy_f16(n, 0.75f, h.data(), want_axpy.data());
    for (Isa isa : kAllIsas) {
      if (!isa_available(isa)) continue;
      const VectorKernels& vk = vector_kernels(isa);
      EXPECT_EQ(vk.isa, isa);
      EXPECT_NEAR(vk.dot_f32_f16(n, x.data(), h.data()), want_f16, bound_f16) << isa_name(isa) << " n " << n;
      EXPECT_NEAR(vk.dot_f32(n, x.data(), y.data()), want_f32, bound_f32) << isa_name(isa) << " n " << n;
      std::vector<float> got = y;
      got.push_back(42.0f);
      vk.axpy_f16(n, 0.75f, h.data(), got.data());
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], want_axpy[i], 1e-6f * (1 + std::fabs(want_axpy[i])));
      EXPECT_EQ(got[n], 42.0f);
    }
  }
  // The row kernels (attention's loops) are the one-row kernels, row by row, bit for bit, on every ISA.
  {
    const int64_t n = 64, rows = 37, stride = 72;
    const std::vector<float> q = random_floats(rng, n), a = random_floats(rng, rows);
    const std::vector<float> kf = random_floats(rng, rows * stride);
    std::vector<fp16_t> kh(kf.size());
    ref.fp32_to_fp16_row(kf.data(), kh.data(), static_cast<int64_t>(kf.size()));
    for (Isa isa : kAllIsas) {
      if (!isa_available(isa)) continue;
      const VectorKernels& vk = vector_kernels(isa);
      std::vector<float> got(rows), lanes(16 * n, 0.0f), want_lanes(16 * n, 0.0f);
      vk.dot_f32_f16_rows(n, q.data(), kh.data(), stride, rows, 0.125f, got.data());
      vk.axpy_f16_rows(n, a.data(), kh.data(), stride, rows, 5, lanes.data(), n);
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_EQ(got[r], vk.dot_f32_f16(n, q.data(), kh.data() + r * stride) * 0.125f) << isa_name(isa) << " row " << r;
        vk.axpy_f16(n, a[r], kh.data() + r * stride, want_lanes.data() + ((5 + r) % 16) * n);
      }
      EXPECT_EQ(lanes, want_lanes) << isa_name(isa);
    }
  }
  // The free functions dispatch to best_isa().
  const float x[3] = {1, 2, 3}, y[3] = {4, 5, 6};
  EXPECT_EQ(dot_f32(3, x, y), 32.0f);
  const fp16_t h[3] = {0x3c00, 0x4000, 0xc000};  // 1, 2, -2
  EXPECT_EQ(dot_f32_f16(3, x, h), -1.0f);
  float acc[3] = {1, 1, 1};
  axpy_f16(3, 2.0f, h, acc);
  EXPECT_EQ(acc[2], -3.0f);
}

}  // namespace
}  // namespace inferd::kernels

namespace inferd::kernels {
namespace {

// The decode shape's four-row kernel gives exactly the bits of `dot` with nr = 1, row by row, on every
// ISA that has one (the engine relies on this for bit-identical results on both paths).
TEST(Dot, FourWeightRowsEqualDotBitForBit) {
  std::mt19937 rng(23);
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ5_0, DType::kQ4_1, DType::kQ5_1, DType::kQ4_K, DType::kQ5_K,
                  DType::kQ6_K, DType::kQ2_K, DType::kQ3_K, DType::kIQ4_NL, DType::kIQ4_XS}) {
    const bool k_quant = dtype_info(t)->block_size == 256;
    for (int64_t k : k_quant ? std::vector<int64_t>{256, 768, 2048} : std::vector<int64_t>{32, 96, 576, 2048}) {
      const size_t row_bytes = dtype_row_bytes(t, k) + 64;  // rows not back to back
      std::vector<uint8_t> w(row_bytes * 4);
      for (int r = 0; r < 4; ++r) {
        const std::vector<uint8_t> row = random_weights(rng, t, k);
        std::copy(row.begin(), row.end(), w.begin() + static_cast<std::ptrdiff_t>(r * row_bytes));
      }
      const std::vector<uint8_t> act = random_act(rng, t, k);
      for (Isa isa : kAllIsas) {
        if (!isa_available(isa)) continue;
        const TypeKernels* tk = type_kernels(t, isa);
        if (tk->dot_w4 == nullptr) continue;
        float four[4], one[4];
        tk->dot_w4(k, w.data(), row_bytes, act.data(), four);
        for (int r = 0; r < 4; ++r) tk->dot(k, w.data() + r * row_bytes, act.data(), act.size(), 1, &one[r]);
        for (int r = 0; r < 4; ++r) {
          EXPECT_EQ(std::memcmp(&four[r], &one[r], sizeof(float)), 0)
              << dtype_name(t) << " " << isa_name(isa) << " k " << k << " row " << r << ": " << four[r] << " vs " << one[r];
        }
      }
    }
  }
}

// Interleaving is a permutation inside each 16-row group: deinterleave undoes it, copy_row reads any row
// back, and the matrix keeps its size.
TEST(WeightLayout, InterleaveRoundTripsAndCopyRowReadsEveryRow) {
  std::mt19937 rng(5);
  for (DType t : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    for (int64_t k : {256, 768, 2048}) {
      const int64_t rows = 48;
      const size_t row_bytes = dtype_row_bytes(t, k);
      const std::vector<uint8_t> plain = random_matrix(rng, t, k, rows);
      std::vector<uint8_t> inter(plain.size()), back(plain.size());
      interleave_groups(t, k, rows / kInterleaveRows, plain.data(), inter.data());
      EXPECT_NE(inter, plain) << dtype_name(t);
      deinterleave_groups(t, k, rows / kInterleaveRows, inter.data(), back.data());
      EXPECT_EQ(back, plain) << dtype_name(t) << " k " << k;
      std::vector<uint8_t> row(row_bytes);
      for (int64_t r = 0; r < rows; ++r) {
        copy_row(t, WeightLayout::kInterleaved16, k, inter.data(), r, row.data());
        ASSERT_EQ(std::memcmp(row.data(), plain.data() + r * row_bytes, row_bytes), 0) << dtype_name(t) << " row " << r;
      }
      // Block column 0 of group 0 starts with the 16 rows' scales d, in row order.
      const size_t d_at = t == DType::kQ6_K ? offsetof(BlockQ6_K, d) : 0;
      for (int j = 0; j < 16; ++j) EXPECT_EQ(std::memcmp(inter.data() + 2 * j, plain.data() + j * row_bytes + d_at, 2), 0);
    }
    EXPECT_TRUE(layout_fits(WeightLayout::kInterleaved16, t, 32, 256));
    EXPECT_FALSE(layout_fits(WeightLayout::kInterleaved16, t, 40, 256));
  }
  EXPECT_FALSE(layout_fits(WeightLayout::kInterleaved16, DType::kQ3_K, 32, 256));
  EXPECT_TRUE(layout_fits(WeightLayout::kRows, DType::kQ4_K, 33, 256));
}

// The interleaved decode kernel gives, for each of a group's 16 rows, exactly the bits of `dot` (nr = 1)
// on that row in the row layout, on every ISA that has it.
TEST(Dot, InterleavedGroupEqualsDotBitForBit) {
  std::mt19937 rng(29);
  int checked = 0;
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    const bool k_quant = dtype_info(t)->block_size == 256;
    for (int64_t k : k_quant ? std::vector<int64_t>{256, 512, 2048, 5632} : std::vector<int64_t>{32, 64, 96, 576, 2048, 5632}) {
      const size_t row_bytes = dtype_row_bytes(t, k);
      const std::vector<uint8_t> plain = random_matrix(rng, t, k, 16);
      std::vector<uint8_t> group(plain.size());
      interleave_groups(t, k, 1, plain.data(), group.data());
      const std::vector<uint8_t> act = random_act(rng, t, k);
      for (Isa isa : kAllIsas) {
        if (!isa_available(isa)) continue;
        const TypeKernels* tk = type_kernels(t, isa);
        if (tk->dot_x16 == nullptr) continue;
        float sixteen[16], one;
        tk->dot_x16(k, group.data(), act.data(), sixteen);
        for (int r = 0; r < 16; ++r) {
          tk->dot(k, plain.data() + r * row_bytes, act.data(), act.size(), 1, &one);
          EXPECT_EQ(std::memcmp(&sixteen[r], &one, sizeof(float)), 0)
              << dtype_name(t) << " " << isa_name(isa) << " k " << k << " row " << r << ": " << sixteen[r] << " vs " << one;
        }
        ++checked;
      }
    }
  }
  if (isa_available(Isa::kAvx2)) {
    EXPECT_GT(checked, 0);
  }
}

}  // namespace
}  // namespace inferd::kernels

namespace inferd::kernels {
namespace {

// gelu as ggml's CPU backend computes it (GGML_GELU_FP16): its table at x rounded to F16; the identity
// from 10 up, 0 from -10 down.
TEST(GgmlMath, GeluIsGgmlsF16Table) {
  for (float x : {-12.0f, -10.0f, -3.3f, -1.0f, -0.01f, 0.0f, 1e-5f, 0.5f, 1.0f, 2.7182817f, 9.99f, 10.0f, 33.0f}) {
    float want;
    if (x <= -10.0f) {
      want = 0.0f;
    } else if (x >= 10.0f) {
      want = x;
    } else {
      const float h = fp16_to_fp32(fp32_to_fp16(x));
      const float g = 0.5f * h * (1.0f + std::tanh(0.79788456080286535587989211986876f * h * std::fma(0.044715f * h, h, 1.0f)));
      want = fp16_to_fp32(fp32_to_fp16(g));
    }
    EXPECT_EQ(gelu(x), want) << x;
  }
  // The table is ggml_gelu_f32 as llama.cpp's x86 builds compile it, with 1 + (A x) x contracted into an FMA;
  // the uncontracted formula differs from it at some halves, so this part fails on a table built without it.
  int contracted_differs = 0;
  for (uint32_t i = 0; i < (1u << 16); ++i) {
    const float h = fp16_to_fp32(static_cast<fp16_t>(i));
    if (!(h > -10.0f && h < 10.0f)) continue;
    const float fused = 0.5f * h * (1.0f + std::tanh(0.79788456080286535587989211986876f * h * std::fma(0.044715f * h, h, 1.0f)));
    const float plain = 0.5f * h * (1.0f + std::tanh(0.79788456080286535587989211986876f * h * (1.0f + (0.044715f * h) * h)));
    ASSERT_EQ(gelu(h), fp16_to_fp32(fp32_to_fp16(fused))) << h;
    contracted_differs += fp32_to_fp16(fused) != fp32_to_fp16(plain);
  }
  EXPECT_GT(contracted_differs, 0);
  std::printf("gelu table: %d of the halves in (-10, 10) differ between the fused and the plain formula\n", contracted_differs);
  EXPECT_NEAR(gelu(1.0f), 0.8412f, 1e-3f);  // the function itself
  const std::vector<float> g = {-11.0f, -1.5f, 0.25f, 3.0f, 12.0f}, u = {2.0f, -1.0f, 4.0f, 0.5f, 3.0f};
  std::vector<float> y(g.size());
  geglu(static_cast<int64_t>(g.size()), g.data(), u.data(), y.data());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(y[i], gelu(g[i]) * u[i]) << i;
}

// Every ISA's GeGLU (F16C's conversions 8 at a time) gives the scalar kernel's bits: gates across the
// range, the edges at -10 and 10, halfway cases between two halves, a tail past the last 8.
TEST(GgmlMath, GegluIsBitIdenticalOnEveryIsa) {
  std::mt19937 rng(23);
  const int64_t n = 8 * 40 + 5;
  std::vector<float> g = random_floats(rng, n, 12.0f), u = random_floats(rng, n, 3.0f);
  const float edges[] = {-10.0f, 10.0f, std::nextafter(-10.0f, 0.0f), std::nextafter(10.0f, 0.0f), -0.0f, 0.0f,
                         1.0f + 0x1p-11f /* halfway between two halves */, 1.0f + 0x1p-11f * 3.0f, 65504.0f, -1e6f};
  for (size_t i = 0; i < std::size(edges); ++i) g[i] = edges[i];
  std::vector<float> want(n);
  vector_kernels(Isa::kScalar).geglu(n, g.data(), u.data(), want.data());
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(want[i], g[i] <= -10.0f ? 0.0f : gelu(g[i]) * u[i]) << g[i];
  for (Isa isa : kAllIsas) {
    if (!isa_available(isa)) continue;
    std::vector<float> got(n + 1, 42.0f);
    vector_kernels(isa).geglu(n, g.data(), u.data(), got.data());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), 4 * n), 0) << isa_name(isa);
    EXPECT_EQ(got[n], 42.0f);
  }
}

}  // namespace
}  // namespace inferd::kernels
