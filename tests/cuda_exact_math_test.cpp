// The CUDA backend's exact arithmetic (inferd/kernels/cuda_exact_math.h) against the CPU engine's
// kernels, on the host: every function the exact CUDA kernels are made of, run here in the order the
// kernels run it (one row's blocks one after another, each lane's chain in turn), must give the CPU's
// bits. The header is compiled with the device's rounding rules (no contraction: this file is built with
// -ffp-contract=off), so what passes here differs on the GPU only by how the work is split, which the
// backend-ops suite checks on a device (the cuda_exact variant, bit for bit).
#include "inferd/kernels/cuda_exact_math.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "inferd/dtype.h"
#include "inferd/kernels/cpu.h"
#include "inferd/kernels/test_weights.h"

namespace inferd::cuda::exact {
namespace {

namespace K = inferd::kernels;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The x86 instruction sets this CPU has: the order the exact kernels follow is theirs.
std::vector<K::Isa> x86_isas() {
  std::vector<K::Isa> out;
  for (K::Isa isa : {K::Isa::kAvx2, K::Isa::kAvx512}) {
    if (K::isa_available(isa)) out.push_back(isa);
  }
  return out;
}

TEST(CudaExactMath, HalfConversionsEqualF16C) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = K::fp16_to_fp32(static_cast<fp16_t>(h));
    const float got = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      ASSERT_EQ(bits(got), bits(want)) << "half " << h;
    }
  }
  std::mt19937 rng(7);
  std::vector<float> probes = {0.0f, -0.0f, 65504.0f, 65519.996f, 65520.0f, 1e9f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f,
                               0x1p-14f, 0x1.ffcp-15f, std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::denorm_min()};
  for (int i = 0; i < 2000000; ++i) probes.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  for (int i = 0; i < 200000; ++i) {
    // Around the half range, where rounding matters most.
    probes.push_back(std::ldexp(std::uniform_real_distribution<float>(1.0f, 2.0f)(rng), static_cast<int>(rng() % 48) - 30));
  }
  for (float f : probes) {
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_half(f), static_cast<uint16_t>(K::fp32_to_fp16(f))) << f;
  }
}

TEST(CudaExactMath, SiluExpSumAndQkEqualTheCpu) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-30.0f, 30.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = u(rng);
    ASSERT_EQ(bits(silu(x)), bits(K::silu(x))) << x;
  }
  for (int n : {1, 15, 16, 17, 100, 333}) {
    std::vector<float> x(static_cast<size_t>(n)), y(x.size()), mine(x.size());
    for (float& v : x) v = u(rng);
    const float mx = *std::max_element(x.begin(), x.end());
    const double want = K::exp_sum(n, x.data(), mx, y.data());
    double total = 0.0;
    for (int c = 0; c < n; c += 16) {
      float e[16];
      for (int l = 0; l < 16; ++l) e[l] = c + l < n ? (mine[static_cast<size_t>(c + l)] = expf_lane(x[static_cast<size_t>(c + l)] - mx)) : 0.0f;
      total += static_cast<double>(reduce16(e));
    }
    EXPECT_EQ(total, want) << n;
    EXPECT_EQ(0, std::memcmp(y.data(), mine.data(), y.size() * 4)) << n;
  }
  for (int hd : {64, 72, 80, 128, 256}) {
    std::vector<float> q(static_cast<size_t>(hd));
    std::vector<uint16_t> k(static_cast<size_t>(hd));
    for (int i = 0; i < hd; ++i) {
      q[static_cast<size_t>(i)] = round_half(u(rng) / 10.0f);  // Q meets the cache as F16
      k[static_cast<size_t>(i)] = float_to_half(u(rng) / 10.0f);
    }
    for (K::Isa isa : x86_isas()) {
      const float want = K::vector_kernels(isa).dot_f32_f16(hd, q.data(), reinterpret_cast<const fp16_t*>(k.data()));
      float lanes[16];
      for (int l = 0; l < 16; ++l) lanes[l] = qk_lane(q.data(), k.data(), hd, l);
      EXPECT_EQ(bits(qk_finish(lanes, q.data(), k.data(), hd)), bits(want)) << "head_dim " << hd << " " << K::isa_name(isa);
    }
  }
}

// The CPU's activation blocks (ggml's layouts).
struct CpuQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
struct CpuQ8_1 {
  uint16_t d, s;
  int8_t qs[32];
};
struct CpuQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};
static_assert(sizeof(CpuQ8_0) == 34 && sizeof(CpuQ8_1) == 36 && sizeof(CpuQ8_K) == 292);

std::vector<float> activations(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = u(rng);
  for (int64_t i = 0; i < 32 && i < n; ++i) x[static_cast<size_t>(i)] = 0.0f;  // a block of zeros
  if (n >= 64) x[40] = -7.5f;                                                 // a negative maximum
  return x;
}

TEST(CudaExactMath, ActivationsAreQuantizedAsTheCpuQuantizesThem) {
  const int64_t k = 1024;
  const std::vector<float> x = activations(k, 3);
  for (K::Isa isa : x86_isas()) {
    std::vector<CpuQ8_0> q0(static_cast<size_t>(k / 32));
    std::vector<CpuQ8_1> q1(q0.size());
    std::vector<CpuQ8_K> qk(static_cast<size_t>(k / 256));
    K::type_kernels(DType::kQ4_0, isa)->quantize_act(x.data(), q0.data(), k);
    K::type_kernels(DType::kQ4_1, isa)->quantize_act(x.data(), q1.data(), k);
    K::type_kernels(DType::kQ4_K, isa)->quantize_act(x.data(), qk.data(), k);
    for (size_t b = 0; b < q0.size(); ++b) {
      Q8Block mine;
      quantize_q8(&x[32 * b], &mine);
      EXPECT_EQ(bits(mine.d), bits(half_to_float(q0[b].d))) << b;
      EXPECT_EQ(bits(mine.d), bits(half_to_float(q1[b].d))) << b;
      EXPECT_EQ(bits(mine.s), bits(half_to_float(q1[b].s))) << b;
      EXPECT_EQ(0, std::memcmp(mine.qs, q0[b].qs, 32)) << b;
      EXPECT_EQ(0, std::memcmp(mine.qs, q1[b].qs, 32)) << b;
    }
    for (size_t b = 0; b < qk.size(); ++b) {
      Q8KBlock mine;
      quantize_q8k(&x[256 * b], &mine);
      EXPECT_EQ(bits(mine.d), bits(qk[b].d)) << b;
      EXPECT_EQ(0, std::memcmp(mine.qs, qk[b].qs, 256)) << b;
      for (int g = 0; g < 16; ++g) EXPECT_EQ(mine.bsums[g], qk[b].bsums[g]) << b << " " << g;
    }
  }
}

// One row's dot as the exact kernels compute it: blocks in order, each lane's chain, then finish.
template <uint32_t T>
float exact_row(const uint8_t* row, const std::vector<float>& x, int64_t k) {
  if constexpr (is_float(T)) {
    float lanes[16];
    for (int l = 0; l < 16; ++l) lanes[l] = float_lane<T>(row, x.data(), k, l);
    return float_finish<T>(lanes, row, x.data(), k);
  } else if constexpr (is_k_quant(T)) {
    RowAcc r;
    for (int64_t b = 0; b < k / 256; ++b) {
      Q8KBlock a;
      quantize_q8k(&x[static_cast<size_t>(256 * b)], &a);
      const uint8_t* blk = row + b * block_bytes(T);
      int lane[8], p[4] = {0, 0, 0, 0};
      k_lanes<T>(blk, a, lane, p);
      k_step<T>(r, k_d(T, blk), T == kQ6_K ? 0.0f : k_dmin(blk), a, lane, p);
    }
    return finish<T>(r);
  } else {
    RowAcc r;
    for (int64_t b = 0; b < k / 32; ++b) {
      Q8Block a;
      quantize_q8(&x[static_cast<size_t>(32 * b)], &a);
      const uint8_t* blk = row + b * block_bytes(T);
      int isum[8];
      block_isums<T>(blk, a, isum);
      block_step<T>(r, block_d<T>(blk), has_min(T) ? block_m<T>(blk) : 0.0f, a, isum);
    }
    return finish<T>(r);
  }
}

template <uint32_t T>
void check_type(DType type, std::initializer_list<int64_t> widths) {
  for (int64_t k : widths) {
    const int64_t rows = 6;
    const size_t row_bytes = dtype_row_bytes(type, k);
    std::vector<uint8_t> w(static_cast<size_t>(rows) * row_bytes);
    std::mt19937 rng(static_cast<uint32_t>(k) * 31u + T);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> values(static_cast<size_t>(k));
    for (int64_t r = 0; r < rows; ++r) {
      for (float& v : values) v = u(rng);
      K::testing::encode_weight_row(type, values.data(), k, static_cast<uint32_t>(r + 1), 1.0f, &w[r * row_bytes]);
    }
    const std::vector<float> x = activations(k, static_cast<uint32_t>(k) + T);
    for (K::Isa isa : x86_isas()) {
      const K::TypeKernels* tk = K::type_kernels(type, isa);
      ASSERT_NE(tk, nullptr);
      std::vector<uint8_t> act(dtype_row_bytes(tk->act_type, k));
      tk->quantize_act(x.data(), act.data(), k);
      for (int64_t r = 0; r < rows; ++r) {
        if (type == DType::kF32 && isa == K::Isa::kAvx2 && k % 8 >= 4) continue;  // GCC vectorizes that tail
        float want = 0.0f;
        tk->dot(k, &w[r * row_bytes], act.data(), act.size(), 1, &want);
        const float got = exact_row<T>(&w[r * row_bytes], x, k);
        EXPECT_EQ(bits(got), bits(want)) << dtype_name(type) << " k=" << k << " row " << r << " " << K::isa_name(isa)
                                         << ": " << got << " vs " << want;
      }
    }
    // The embedding lookup: every element as to_float gives it.
    std::vector<float> want(static_cast<size_t>(k));
    K::type_kernels(type)->to_float(&w[0], want.data(), k);
    for (int64_t i = 0; i < k; ++i) {
      ASSERT_EQ(bits(weight_value<T>(&w[0], i)), bits(want[static_cast<size_t>(i)])) << dtype_name(type) << " element " << i;
    }
  }
}

TEST(CudaExactMath, EveryWeightTypesRowDotEqualsTheCpuKernels) {
  if (x86_isas().empty()) GTEST_SKIP() << "the exact kernels follow the x86 kernels' order; this CPU has neither AVX2 nor AVX-512";
  check_type<kQ8_0>(DType::kQ8_0, {32, 96, 576, 4096});
  check_type<kQ4_0>(DType::kQ4_0, {32, 96, 576, 4096});
  check_type<kQ4_1>(DType::kQ4_1, {32, 96, 576, 4096});
  check_type<kQ5_0>(DType::kQ5_0, {32, 96, 576, 4096});
  check_type<kQ5_1>(DType::kQ5_1, {32, 96, 576, 4096});
  check_type<kQ4_K>(DType::kQ4_K, {256, 768, 4096});
  check_type<kQ5_K>(DType::kQ5_K, {256, 768, 4096});
  check_type<kQ6_K>(DType::kQ6_K, {256, 768, 4096});
  check_type<kF32>(DType::kF32, {16, 24, 40, 576, 1000});
  check_type<kF16>(DType::kF16, {16, 24, 28, 40, 576, 1000});
  check_type<kBF16>(DType::kBF16, {16, 24, 28, 40, 576, 1000});
}

}  // namespace
}  // namespace inferd::cuda::exact
