// Tests for inferd/kernels/gemm.h: every ISA's GEMM against an independent lane-by-lane emulation
// of the numerics contract (bit equality) and against the scalar dot kernels (tolerance), over
// activation counts, sizes, ragged row ranges, strides, bias and accumulation.
#include "inferd/kernels/gemm.h"
#include "inferd/weight_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "inferd/kernels/cpu.h"
#include "inferd/kernels/quantize.h"
#include "isa_tables.h"

namespace inferd::kernels {
namespace {

constexpr DType kGemmTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0};
constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};
constexpr float kSentinel = -12345.0f;

std::vector<float> random_floats(std::mt19937& rng, int64_t n, float scale) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// The contract of gemm.h for one weight row and one activation row, written independently of the
// library: 8 float lanes, fused multiply-add of the exact lane integer, fixed reduction order.
float contract_dot(DType type, int64_t k, const uint8_t* w, const uint8_t* a) {
  float acc[8] = {};
  float summs = 0.0f;
  for (int64_t b = 0; b < k / 32; ++b) {
    int q[32];
    const int8_t* aq;
    float scale;
    if (type == DType::kQ4_1) {
      const auto& wb = reinterpret_cast<const BlockQ4_1*>(w)[b];
      const auto& ab = reinterpret_cast<const BlockQ8_1*>(a)[b];
      for (int j = 0; j < 16; ++j) {
        q[j] = wb.qs[j] & 15;
        q[j + 16] = wb.qs[j] >> 4;
      }
      aq = ab.qs;
      scale = fp16_to_fp32(wb.d) * fp16_to_fp32(ab.d);
      summs = std::fma(fp16_to_fp32(wb.m), fp16_to_fp32(ab.s), summs);
    } else {
      const auto& ab = reinterpret_cast<const BlockQ8_0*>(a)[b];
      aq = ab.qs;
      if (type == DType::kQ4_0) {
        const auto& wb = reinterpret_cast<const BlockQ4_0*>(w)[b];
        for (int j = 0; j < 16; ++j) {
          q[j] = (wb.qs[j] & 15) - 8;
          q[j + 16] = (wb.qs[j] >> 4) - 8;
        }
        scale = fp16_to_fp32(wb.d) * fp16_to_fp32(ab.d);
      } else if (type == DType::kIQ4_NL) {
        static constexpr int kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
        const auto& wb = reinterpret_cast<const BlockIQ4_NL*>(w)[b];
        for (int j = 0; j < 16; ++j) {
          q[j] = kValues[wb.qs[j] & 15];
          q[j + 16] = kValues[wb.qs[j] >> 4];
        }
        scale = fp16_to_fp32(wb.d) * fp16_to_fp32(ab.d);
      } else {
        const auto& wb = reinterpret_cast<const BlockQ8_0*>(w)[b];
        for (int j = 0; j < 32; ++j) q[j] = wb.qs[j];
        scale = fp16_to_fp32(wb.d) * fp16_to_fp32(ab.d);
      }
    }
    for (int i = 0; i < 8; ++i) {
      int n = 0;
      for (int j = 4 * i; j < 4 * i + 4; ++j) n += q[j] * aq[j];
      acc[i] = std::fma(scale, static_cast<float>(n), acc[i]);
    }
  }
  const float r0 = acc[4] + acc[0], r1 = acc[5] + acc[1], r2 = acc[6] + acc[2], r3 = acc[7] + acc[3];
  const float s = (r0 + r2) + (r1 + r3);
  return type == DType::kQ4_1 ? s + summs : s;
}

struct Problem {
  DType type;
  int64_t k, rows, m;
  size_t w_row_bytes, act_stride;
  std::vector<uint8_t> w, act;
  std::vector<float> bias;
  std::vector<float> bound;  // per activation row: 2 * max|w| * sum|a|, the dot tolerance scale
};

// p.m activation rows quantized to the type's activation encoding (rows not back to back), and the dot tolerance
// scale of each (2.2 * w_max * sum|a|).
void add_activations(std::mt19937& rng, Problem& p, float w_max) {
  const TypeKernels* ref = type_kernels(p.type, Isa::kScalar);
  p.act_stride = dtype_row_bytes(ref->act_type, p.k) + 10;
  p.act.resize(p.act_stride * p.m);
  for (int64_t t = 0; t < p.m; ++t) {
    const std::vector<float> x = random_floats(rng, p.k, t % 3 == 2 ? 10.0f : 1.0f);
    ref->quantize_act(x.data(), p.act.data() + t * p.act_stride, p.k);
    float s = 0.0f;
    for (float v : x) s += std::fabs(v);
    p.bound.push_back(2.2f * w_max * s);
  }
}

Problem make_problem(std::mt19937& rng, DType type, int64_t k, int64_t rows, int64_t m) {
  Problem p{type, k, rows, m, dtype_row_bytes(type, k), 0, {}, {}, {}, {}};
  p.w_row_bytes += 6;  // rows not packed back to back (and not 2-byte aligned)
  p.w.resize(p.w_row_bytes * rows);
  float w_max = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> x = random_floats(rng, k, r % 5 == 4 ? 1.0f : 0.05f);
    quantize_row_ref(type, x.data(), p.w.data() + r * p.w_row_bytes, k);
    for (float v : x) w_max = std::max(w_max, std::fabs(v));
  }
  add_activations(rng, p, w_max);
  p.bias = random_floats(rng, rows, 1.0f);
  return p;
}

// Runs `fn` over [r0, r1) into an output of stride rows + 3 filled with sentinels.
std::vector<float> run(GemmFn fn, const Problem& p, int64_t r0, int64_t r1, bool accumulate, bool bias) {
  const int64_t out_stride = p.rows + 3;
  std::vector<float> out(out_stride * p.m, kSentinel);
  GemmArgs args{p.type, p.k, p.w.data(), p.w_row_bytes, r0, r1, p.act.data(), p.act_stride,
                p.m, out.data(), out_stride, accumulate, bias ? p.bias.data() : nullptr};
  fn(args);
  return out;
}

TEST(Gemm, KernelAvailability) {
  EXPECT_EQ(gemm_kernel(DType::kQ4_K, Isa::kScalar), nullptr);
  EXPECT_EQ(gemm_kernel(DType::kQ5_1, Isa::kAvx512), nullptr);
  EXPECT_EQ(gemm_kernel(DType::kF32, best_isa()), nullptr);
  for (DType t : kGemmTypes) EXPECT_NE(gemm_kernel(t, Isa::kScalar), nullptr) << dtype_name(t);
  if (isa_available(Isa::kAvx2)) {
    // Also for AVX-512 requests: there is always a SIMD GEMM for these types on an AVX2 CPU.
    for (DType t : kGemmTypes) EXPECT_NE(gemm_kernel(t, Isa::kAvx2), nullptr) << dtype_name(t);
    for (DType t : kGemmTypes) EXPECT_NE(gemm_kernel(t, Isa::kAvx512), nullptr) << dtype_name(t);
    if (isa_available(Isa::kAvx512)) {
      for (DType t : kGemmTypes) EXPECT_NE(gemm_kernel(t, Isa::kAvx2), gemm_kernel(t, Isa::kAvx512)) << dtype_name(t);
    }
  }
  // The K-quants: a GEMM per SIMD ISA, none for the scalar ISA (the dot kernels are its reference).
  for (DType t : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    EXPECT_EQ(gemm_kernel(t, Isa::kScalar), nullptr) << dtype_name(t);
    EXPECT_EQ(gemm_kernel(t, Isa::kAvx2) != nullptr, isa_available(Isa::kAvx2)) << dtype_name(t);
    EXPECT_EQ(gemm_kernel(t, Isa::kAvx512) != nullptr, isa_available(Isa::kAvx2)) << dtype_name(t);
    if (isa_available(Isa::kAvx512)) {
      EXPECT_NE(gemm_kernel(t, Isa::kAvx2), gemm_kernel(t, Isa::kAvx512)) << dtype_name(t);
    } else {
      EXPECT_EQ(gemm_kernel(t, Isa::kAvx2), gemm_kernel(t, Isa::kAvx512)) << dtype_name(t);
    }
  }
  // Q2_K, Q3_K and IQ4_XS: the AVX2 GEMM for both SIMD ISAs (their dot kernels are the same on both).
  for (DType t : {DType::kQ2_K, DType::kQ3_K, DType::kIQ4_XS}) {
    EXPECT_EQ(gemm_kernel(t, Isa::kScalar), nullptr) << dtype_name(t);
    EXPECT_EQ(gemm_kernel(t, Isa::kAvx2) != nullptr, isa_available(Isa::kAvx2)) << dtype_name(t);
    EXPECT_EQ(gemm_kernel(t, Isa::kAvx2), gemm_kernel(t, Isa::kAvx512)) << dtype_name(t);
  }
}

TEST(Gemm, BitIdenticalToContractAndCloseToScalarDot) {
  std::mt19937 rng(21);
  // 130 activation rows: more than one token block of the rows-in-lanes GEMMs.
  const int64_t ms[] = {1, 2, 3, 5, 8, 13, 64, 130};
  const int64_t ks[] = {32, 96, 576, 2048 + 32};
  for (DType type : kGemmTypes) {
    const TypeKernels* scalar = type_kernels(type, Isa::kScalar);
    for (int64_t k : ks) {
      for (int64_t m : ms) {
        const int64_t rows = 23;
        const Problem p = make_problem(rng, type, k, rows, m);
        // Contract and scalar-dot references for every (row, activation row).
        std::vector<float> want(rows * m), dot(rows * m);
        for (int64_t t = 0; t < m; ++t) {
          for (int64_t r = 0; r < rows; ++r) {
            want[t * rows + r] = contract_dot(type, k, p.w.data() + r * p.w_row_bytes,
                                              p.act.data() + t * p.act_stride);
            scalar->dot(k, p.w.data() + r * p.w_row_bytes, p.act.data() + t * p.act_stride, p.act_stride, 1,
                        &dot[t * rows + r]);
          }
        }
        for (Isa isa : kAllIsas) {
          if (!isa_available(isa)) continue;
          const GemmFn fn = gemm_kernel(type, isa);
          if (fn == nullptr) continue;
          const int64_t ranges[][2] = {{0, rows}, {1, 10}, {5, 6}, {7, rows}};
          for (const auto& range : ranges) {
            const int64_t r0 = range[0], r1 = range[1];
            const std::vector<float> out = run(fn, p, r0, r1, false, false);
            for (int64_t t = 0; t < m; ++t) {
              for (int64_t c = 0; c < rows + 3; ++c) {
                const float got = out[t * (rows + 3) + c];
                SCOPED_TRACE(testing::Message() << dtype_name(type) << " " << isa_name(isa) << " k " << k << " m "
                                                << m << " rows [" << r0 << "," << r1 << ") t " << t << " r " << c);
                if (c < r0 || c >= r1) {
                  ASSERT_EQ(got, kSentinel) << "write outside the row range";
                  continue;
                }
                const float w = want[t * rows + c];
                ASSERT_EQ(std::memcmp(&got, &w, sizeof(float)), 0) << got << " vs contract " << w;
                ASSERT_NEAR(got, dot[t * rows + c], 1e-5 * p.bound[t] + 1e-6);
              }
            }
          }
        }
      }
    }
  }
}

// Random rows of a 256-element super-block type (Q2_K to Q6_K, IQ4_XS): random codes and scales, finite fp16
// block scales.
Problem make_k_problem(std::mt19937& rng, DType type, int64_t k, int64_t rows, int64_t m) {
  Problem p{type, k, rows, m, dtype_row_bytes(type, k) + 6, 0, {}, {}, {}, {}};
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  p.w.resize(p.w_row_bytes * rows);
  for (auto& b : p.w) b = static_cast<uint8_t>(byte(rng));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = p.w.data() + r * p.w_row_bytes;
    for (int64_t b = 0; b < k / kQK_K; ++b) {
      if (type == DType::kQ5_K) {
        auto* blk = reinterpret_cast<BlockQ5_K*>(row) + b;
        blk->d = fp32_to_fp16(scale(rng));
        blk->dmin = fp32_to_fp16(scale(rng));
      } else if (type == DType::kQ4_K) {
        auto* blk = reinterpret_cast<BlockQ4_K*>(row) + b;
        blk->d = fp32_to_fp16(scale(rng));
        blk->dmin = fp32_to_fp16(scale(rng));
      } else if (type == DType::kQ2_K) {
        auto* blk = reinterpret_cast<BlockQ2_K*>(row) + b;
        blk->d = fp32_to_fp16(scale(rng));
        blk->dmin = fp32_to_fp16(scale(rng));
      } else if (type == DType::kQ3_K) {
        reinterpret_cast<BlockQ3_K*>(row)[b].d = fp32_to_fp16(scale(rng));
      } else if (type == DType::kIQ4_XS) {
        reinterpret_cast<BlockIQ4_XS*>(row)[b].d = fp32_to_fp16(scale(rng));
      } else if (type == DType::kIQ4_NL) {
        for (int64_t j = 0; j < kQK_K / 32; ++j) reinterpret_cast<BlockIQ4_NL*>(row)[b * kQK_K / 32 + j].d = fp32_to_fp16(scale(rng));
      } else {
        reinterpret_cast<BlockQ6_K*>(row)[b].d = fp32_to_fp16(scale(rng));
      }
    }
  }
  const TypeKernels* ref = type_kernels(type, Isa::kScalar);
  p.act_stride = dtype_row_bytes(ref->act_type, k) + 12;
  p.act.resize(p.act_stride * m);
  for (int64_t t = 0; t < m; ++t) {
    const std::vector<float> x = random_floats(rng, k, t % 3 == 2 ? 10.0f : 1.0f);
    ref->quantize_act(x.data(), p.act.data() + t * p.act_stride, k);
  }
  p.bias = random_floats(rng, rows, 1.0f);
  return p;
}

// The GEMMs read interleaved weights (WeightLayout::kInterleaved16) too: the same bits as on the row layout,
// for row ranges that start at a group (the engine's chunks do) and end anywhere.
TEST(Gemm, InterleavedWeightsGiveTheRowLayoutsBits) {
  std::mt19937 rng(37);
  for (DType type : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    EXPECT_EQ(gemm_kernel_for(type, WeightLayout::kInterleaved16, Isa::kScalar), nullptr);
    EXPECT_EQ(gemm_kernel_for(type, WeightLayout::kRows, Isa::kScalar), gemm_kernel(type, Isa::kScalar));
    const bool k_quant = dtype_info(type)->block_size == kQK_K;
    for (int64_t k : k_quant ? std::vector<int64_t>{256, 2048} : std::vector<int64_t>{32, 576, 2048 + 32}) {
      for (int64_t m : {2, 5, 16}) {
        const int64_t rows = 48;
        Problem p = k_quant ? make_k_problem(rng, type, k, rows, m) : make_problem(rng, type, k, rows, m);
        // Packed rows (the interleaved layout has no gaps between rows).
        const size_t row_bytes = dtype_row_bytes(type, k);
        std::vector<uint8_t> packed(row_bytes * rows), inter(row_bytes * rows);
        for (int64_t r = 0; r < rows; ++r) {
          std::memcpy(packed.data() + r * row_bytes, p.w.data() + r * p.w_row_bytes, row_bytes);
        }
        interleave_groups(type, k, rows / kInterleaveRows, packed.data(), inter.data());
        for (Isa isa : kAllIsas) {
          if (!isa_available(isa)) continue;
          const GemmFn fn = gemm_kernel_for(type, WeightLayout::kInterleaved16, isa);
          if (fn == nullptr) continue;
          for (const auto& range : {std::pair<int64_t, int64_t>{0, rows}, {16, 37}, {32, 33}}) {
            const int64_t out_stride = rows + 3;
            std::vector<float> want(out_stride * m, kSentinel), got(out_stride * m, kSentinel);
            GemmArgs a{type, k, packed.data(), row_bytes, range.first, range.second, p.act.data(), p.act_stride,
                       m, want.data(), out_stride, false, p.bias.data()};
            gemm_kernel(type, isa)(a);
            a.w = inter.data();
            a.out = got.data();
            a.layout = WeightLayout::kInterleaved16;
            fn(a);
            ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
                << dtype_name(type) << " " << isa_name(isa) << " k " << k << " m " << m << " rows [" << range.first
                << "," << range.second << ")";
          }
        }
      }
    }
  }
}

// Interleaved Q4_K through GEMMs that walk several L2 chunks of rows: the vec_dot order's tiles read each chunk
// deinterleaved once (RowLayoutView), the repacked GEMM the pieces themselves; both must give the row layout's bits
// for row ranges that start and end inside chunks and groups.
TEST(Gemm, InterleavedQ4_KAcrossChunksGivesTheRowLayoutsBits) {
  std::mt19937 rng(41);
  const DType type = DType::kQ4_K;
  const int64_t k = 2048, rows = 512, m = 9;  // 1152-byte rows: a chunk is 224 rows
  Problem p = make_k_problem(rng, type, k, rows, m);
  const size_t row_bytes = dtype_row_bytes(type, k);
  std::vector<uint8_t> packed(row_bytes * rows), inter(row_bytes * rows);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(packed.data() + r * row_bytes, p.w.data() + r * p.w_row_bytes, row_bytes);
  }
  interleave_groups(type, k, rows / kInterleaveRows, packed.data(), inter.data());
  for (MatmulOrder order : {MatmulOrder::kVecDot, MatmulOrder::kRepacked}) {
    for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
      if (!isa_available(isa)) continue;
      const GemmFn rows_fn = gemm_kernel_for(type, WeightLayout::kRows, isa, order);
      const GemmFn inter_fn = gemm_kernel_for(type, WeightLayout::kInterleaved16, isa, order);
      ASSERT_NE(rows_fn, nullptr);
      ASSERT_NE(inter_fn, nullptr);
      for (const auto& range : {std::pair<int64_t, int64_t>{0, rows}, {16, 501}, {224, 240}, {208, 449}}) {
        const int64_t out_stride = rows + 1;
        std::vector<float> want(out_stride * m, kSentinel), got(out_stride * m, kSentinel);
        GemmArgs a{type, k, packed.data(), row_bytes, range.first, range.second, p.act.data(), p.act_stride,
                   m, want.data(), out_stride, false, p.bias.data()};
        rows_fn(a);
        a.w = inter.data();
        a.out = got.data();
        a.layout = WeightLayout::kInterleaved16;
        inter_fn(a);
        ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
            << matmul_order_name(order) << " " << isa_name(isa) << " rows [" << range.first << "," << range.second
            << ")";
      }
    }
  }
}

// The K-quant GEMMs have no contract emulation of their own: each ISA's must equal that ISA's x86 dot
// kernel (which equals ggml's vec_dot) bit for bit. Q2_K, Q3_K and IQ4_XS have one GEMM (AVX2) for both ISAs.
TEST(Gemm, KQuantsBitIdenticalToDot) {
  if (!isa_available(Isa::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_available(isa)) continue;
    std::mt19937 rng(33);
    for (DType type : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ2_K, DType::kQ3_K, DType::kIQ4_XS}) {
      const GemmFn fn = gemm_kernel(type, isa);
      ASSERT_NE(fn, nullptr) << dtype_name(type);
      const TypeKernels* dot = type_kernels(type, isa);
      for (int64_t k : {256, 768, 2048}) {
        for (int64_t m : {1, 2, 3, 5, 8, 9, 13, 64}) {
          const int64_t rows = 23;
          const Problem p = make_k_problem(rng, type, k, rows, m);
          const int64_t ranges[][2] = {{0, rows}, {1, 10}, {5, 6}, {7, rows}};
          for (const auto& range : ranges) {
            const int64_t r0 = range[0], r1 = range[1];
            const std::vector<float> out = run(fn, p, r0, r1, false, false);
            for (int64_t t = 0; t < m; ++t) {
              for (int64_t c = 0; c < rows + 3; ++c) {
                const float got = out[t * (rows + 3) + c];
                SCOPED_TRACE(testing::Message() << isa_name(isa) << " " << dtype_name(type) << " k " << k << " m " << m
                                                << " rows [" << r0 << "," << r1 << ") t " << t << " r " << c);
                if (c < r0 || c >= r1) {
                  ASSERT_EQ(got, kSentinel) << "write outside the row range";
                  continue;
                }
                float want;
                dot->dot(k, p.w.data() + c * p.w_row_bytes, p.act.data() + t * p.act_stride, p.act_stride, 1,
                         &want);
                ASSERT_EQ(std::memcmp(&got, &want, sizeof(float)), 0) << got << " vs dot " << want;
              }
            }
          }
        }
      }
    }
  }
}

// Runs `fn` over three row ranges of `p` and checks every output: sentinels outside the range, and inside it
// check(t, r, got) (which asserts).
template <typename Check>
void check_row_ranges(GemmFn fn, const Problem& p, const Check& check) {
  const int64_t rows = p.rows;
  const int64_t ranges[][2] = {{0, rows}, {1, 10}, {5, 6}};
  for (const auto& range : ranges) {
    const std::vector<float> out = run(fn, p, range[0], range[1], false, false);
    for (int64_t t = 0; t < p.m; ++t) {
      for (int64_t c = 0; c < rows + 3; ++c) {
        const float got = out[t * (rows + 3) + c];
        SCOPED_TRACE(testing::Message() << "k " << p.k << " m " << p.m << " t " << t << " r " << c);
        if (c < range[0] || c >= range[1]) {
          ASSERT_EQ(got, kSentinel) << "write outside the row range";
          continue;
        }
        check(t, c, got);
        if (testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

// Q5_0 (gemma3's q, k, gate and up in Q4_K_M files): each ISA's GEMM (AVX2; AVX-512 VNNI) equals that ISA's
// dot kernel bit for bit.
TEST(Gemm, Q5_0BitIdenticalToDot) {
  if (!isa_available(Isa::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  EXPECT_EQ(gemm_kernel(DType::kQ5_0, Isa::kScalar), nullptr);
  if (isa_available(Isa::kAvx512)) {
    EXPECT_NE(gemm_kernel(DType::kQ5_0, Isa::kAvx2), gemm_kernel(DType::kQ5_0, Isa::kAvx512));
  }
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_available(isa)) continue;
    std::mt19937 rng(35);
    const GemmFn fn = gemm_kernel(DType::kQ5_0, isa);
    ASSERT_NE(fn, nullptr);
    const TypeKernels* dot = type_kernels(DType::kQ5_0, isa);
    for (int64_t k : {32, 640, 2048}) {
      for (int64_t m : {1, 2, 3, 5, 8, 9, 13, 64}) {
        const int64_t rows = 23;
        const Problem p = make_problem(rng, DType::kQ5_0, k, rows, m);
        SCOPED_TRACE(isa_name(isa));
        check_row_ranges(fn, p, [&](int64_t t, int64_t c, float got) {
          float want;
          dot->dot(k, p.w.data() + c * p.w_row_bytes, p.act.data() + t * p.act_stride, p.act_stride, 1, &want);
          ASSERT_EQ(std::memcmp(&got, &want, sizeof(float)), 0) << got << " vs dot " << want;
        });
        if (HasFatalFailure()) return;
      }
    }
  }
}

// IQ4_NL: random codes and finite block scales.
Problem make_iq4_nl_problem(std::mt19937& rng, int64_t k, int64_t rows, int64_t m) {
  Problem p{DType::kIQ4_NL, k, rows, m, dtype_row_bytes(DType::kIQ4_NL, k) + 6, 0, {}, {}, {}, {}};
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-0.01f, 0.01f);
  p.w.resize(p.w_row_bytes * rows);
  for (auto& b : p.w) b = static_cast<uint8_t>(byte(rng));
  for (int64_t r = 0; r < rows; ++r) {
    auto* blocks = reinterpret_cast<BlockIQ4_NL*>(p.w.data() + r * p.w_row_bytes);
    for (int64_t b = 0; b < k / 32; ++b) blocks[b].d = fp32_to_fp16(scale(rng));
  }
  add_activations(rng, p, 127.0f * 0.01f);
  p.bias = random_floats(rng, rows, 1.0f);
  return p;
}

// IQ4_NL's GEMM accumulates block after block into one 8-lane accumulator (llamafile's tinyBLAS order, what
// llama.cpp runs for two or more activation rows), not in its dot kernel's two: it equals the contract bit
// for bit, and the dot kernels within rounding.
TEST(Gemm, IQ4NLFollowsTheContract) {
  if (!isa_available(Isa::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  EXPECT_EQ(gemm_kernel(DType::kIQ4_NL, Isa::kScalar), nullptr);
  std::mt19937 rng(37);
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    const GemmFn fn = gemm_kernel(DType::kIQ4_NL, isa);
    ASSERT_NE(fn, nullptr);
    const TypeKernels* dot = type_kernels(DType::kIQ4_NL, isa);
    for (int64_t k : {32, 96, 640, 2048 + 32}) {
      for (int64_t m : {1, 2, 3, 5, 8, 13, 64}) {
        const int64_t rows = 23;
        const Problem p = make_iq4_nl_problem(rng, k, rows, m);
        SCOPED_TRACE(isa_name(isa));
        check_row_ranges(fn, p, [&](int64_t t, int64_t c, float got) {
          const uint8_t* w = p.w.data() + c * p.w_row_bytes;
          const uint8_t* a = p.act.data() + t * p.act_stride;
          const float want = contract_dot(DType::kIQ4_NL, k, w, a);
          ASSERT_EQ(std::memcmp(&got, &want, sizeof(float)), 0) << got << " vs contract " << want;
          float d;
          dot->dot(k, w, a, p.act_stride, 1, &d);
          ASSERT_NEAR(got, d, 1e-5 * p.bound[t] + 1e-6);
        });
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(Gemm, BiasAndAccumulate) {
  std::mt19937 rng(5);
  for (DType type : {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K,
                     DType::kIQ4_NL}) {
    const int64_t rows = 13, m = 7;
    const bool k_quant = dtype_info(type)->block_size == kQK_K;
    const Problem p = type == DType::kIQ4_NL ? make_iq4_nl_problem(rng, 160, rows, m)
                      : k_quant              ? make_k_problem(rng, type, 512, rows, m)
                                             : make_problem(rng, type, 160, rows, m);
    for (Isa isa : kAllIsas) {
      if (!isa_available(isa) || gemm_kernel(type, isa) == nullptr) continue;
      const GemmFn fn = gemm_kernel(type, isa);
      const std::vector<float> plain = run(fn, p, 2, rows, false, false);
      const std::vector<float> biased = run(fn, p, 2, rows, false, true);
      const std::vector<float> added = run(fn, p, 2, rows, true, false);
      for (int64_t t = 0; t < m; ++t) {
        for (int64_t r = 2; r < rows; ++r) {
          const size_t i = t * (rows + 3) + r;
          EXPECT_EQ(biased[i], plain[i] + p.bias[r]) << dtype_name(type) << " " << isa_name(isa);
          EXPECT_EQ(added[i], kSentinel + plain[i]) << dtype_name(type) << " " << isa_name(isa);
        }
      }
    }
  }
}

// MatmulOrder::kRepacked (cpu.h) for one weight row and one activation row, written from its definition:
// per block the exact integer dot, then acc = fma(float(n), d_w * d_a, acc).
float repacked_dot(int64_t k, const uint8_t* w, const uint8_t* a) {
  float acc = 0.0f;
  for (int64_t b = 0; b < k / 32; ++b) {
    const auto& wb = reinterpret_cast<const BlockQ4_0*>(w)[b];
    const auto& ab = reinterpret_cast<const BlockQ8_0*>(a)[b];
    int n = 0;
    for (int j = 0; j < 16; ++j) n += ((wb.qs[j] & 15) - 8) * ab.qs[j] + ((wb.qs[j] >> 4) - 8) * ab.qs[j + 16];
    acc = std::fma(static_cast<float>(n), fp16_to_fp32(wb.d) * fp16_to_fp32(ab.d), acc);
  }
  return acc;
}

// llama.cpp's repacked iq4_nl_8x8 order (q4_0_8x8's kernels with the non-linear values), from the block format.
float repacked_dot_iq4_nl(int64_t k, const uint8_t* w, const uint8_t* a) {
  float acc = 0.0f;
  for (int64_t b = 0; b < k / 32; ++b) {
    const auto& wb = reinterpret_cast<const BlockIQ4_NL*>(w)[b];
    const auto& ab = reinterpret_cast<const BlockQ8_0*>(a)[b];
    int n = 0;
    for (int j = 0; j < 16; ++j) {
      n += kIq4nlValues[wb.qs[j] & 15] * ab.qs[j] + kIq4nlValues[wb.qs[j] >> 4] * ab.qs[j + 16];
    }
    acc = std::fma(static_cast<float>(n), fp16_to_fp32(wb.d) * fp16_to_fp32(ab.d), acc);
  }
  return acc;
}

// llama.cpp's repacked q4_K_8x8 orders, written from the block format: its GEMV's (gemm_row false) per
// super-block, the exact integers n = sum_s sc_s * isum_s and m = sum_s mn_s * (bsum_2s + bsum_2s+1),
// acc = fma(float(n), d * d_a, acc), accm = fma(float(m), dmin * d_a, accm); its GEMM's (gemm_row) the same per
// pair of sub-blocks; the result acc - accm.
float repacked_dot_q4_k(int64_t k, const uint8_t* w, const uint8_t* a, bool gemm_row) {
  float acc = 0.0f, accm = 0.0f;
  for (int64_t b = 0; b < k / kQK_K; ++b) {
    const auto& wb = reinterpret_cast<const BlockQ4_K*>(w)[b];
    const auto& ab = reinterpret_cast<const BlockQ8_K*>(a)[b];
    int n = 0, m = 0;
    for (int s = 0; s < 8; ++s) {
      const uint8_t* q = wb.scales;  // ggml's get_scale_min_k4
      const int sc = s < 4 ? q[s] & 63 : (q[s + 4] & 0xF) | ((q[s - 4] >> 6) << 4);
      const int mn = s < 4 ? q[s + 4] & 63 : (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
      int isum = 0;
      for (int l = 0; l < 32; ++l) {
        const uint8_t byte = wb.qs[32 * (s / 2) + l];
        isum += (s % 2 == 0 ? byte & 15 : byte >> 4) * ab.qs[32 * s + l];
      }
      n += sc * isum;
      m += mn * (ab.bsums[2 * s] + ab.bsums[2 * s + 1]);
      if (s % 2 == 1 && gemm_row) {
        acc = std::fma(static_cast<float>(n), fp16_to_fp32(wb.d) * ab.d, acc);
        accm = std::fma(static_cast<float>(m), fp16_to_fp32(wb.dmin) * ab.d, accm);
        n = m = 0;
      }
    }
    if (!gemm_row) {
      acc = std::fma(static_cast<float>(n), fp16_to_fp32(wb.d) * ab.d, acc);
      accm = std::fma(static_cast<float>(m), fp16_to_fp32(wb.dmin) * ab.d, accm);
    }
  }
  return acc - accm;
}

// The repacked order's GEMM of `isa` on p's weights in `layout` (inter: the same rows interleaved, row_bytes
// apart) over the row ranges [0, rows), [16, 37) and [32, 33): every output of the range equals want[t][r]
// bit for bit, every other one is untouched. The scalar ISA has a GEMM only where scalar_gemm (on the row
// layout; the engine gathers interleaved rows): none is checked to be absent.
void expect_repacked_gemm(const Problem& p, const std::vector<uint8_t>& inter, size_t row_bytes, Isa isa,
                          bool scalar_gemm, const std::vector<float>& want, const std::string& what) {
  const int64_t rows = p.rows, m = p.m;
  for (WeightLayout layout : {WeightLayout::kRows, WeightLayout::kInterleaved16}) {
    const GemmFn fn = gemm_kernel_for(p.type, layout, isa, MatmulOrder::kRepacked);
    if ((isa == Isa::kScalar && (!scalar_gemm || layout != WeightLayout::kRows)) ||
        (layout != WeightLayout::kRows && !interleavable(p.type))) {
      EXPECT_EQ(fn, nullptr) << what;
      continue;
    }
    ASSERT_NE(fn, nullptr) << what;
    for (const auto& range : {std::pair<int64_t, int64_t>{0, rows}, {16, 37}, {32, 33}}) {
      const int64_t out_stride = rows + 3;
      std::vector<float> got(out_stride * m, kSentinel);
      const bool inter_layout = layout == WeightLayout::kInterleaved16;
      GemmArgs a{p.type, p.k, inter_layout ? inter.data() : p.w.data(), inter_layout ? row_bytes : p.w_row_bytes,
                 range.first, range.second, p.act.data(), p.act_stride, m, got.data(), out_stride, false, nullptr,
                 layout};
      fn(a);
      for (int64_t t = 0; t < m; ++t) {
        for (int64_t r = 0; r < out_stride; ++r) {
          const float expect = r >= range.first && r < range.second ? want[t * rows + r] : kSentinel;
          ASSERT_EQ(got[t * out_stride + r], expect)
              << "gemm " << what << " " << weight_layout_name(layout) << " row " << r << " act " << t;
        }
      }
    }
  }
}

using DotDefinition = float (*)(int64_t k, const uint8_t* w, const uint8_t* a);
// The order's value for one row and activation row; gemm_row: the activation row is one that llama.cpp's GEMM
// takes (one of the first m - m % 4 of a batch), else its GEMV.
using OrderDefinition = float (*)(int64_t k, const uint8_t* w, const uint8_t* a, bool gemm_row);

// Every kernel of `type`'s repacked order (dot with 1..4 activation rows, dot_w4, dot_x16 and dot_x16_groups on
// interleaved weights, the GEMM on both layouts for 1..70 activation rows and ragged row ranges) equals `definition`
// bit for bit, on every ISA; and the order differs from vec_dot's (`vec_dot` its definition) in more than 100
// outputs.
void check_repacked_order(DType type, OrderDefinition definition, DotDefinition vec_dot, std::initializer_list<int64_t> ks,
                          uint32_t seed) {
  std::mt19937 rng(seed);
  int differs_from_vec_dot = 0;
  for (int64_t k : ks) {
    for (int64_t m : {1, 2, 3, 4, 5, 8, 13, 70}) {
      const int64_t rows = 48;
      // Q4_K: random codes and scales (every code and scale reached, as the int16 bounds assume); IQ4_NL: random
      // codes too (no reference quantizer), k a multiple of 256.
      Problem p = type == DType::kQ4_K || type == DType::kIQ4_NL ? make_k_problem(rng, type, k, rows, m)
                                                                  : make_problem(rng, type, k, rows, m);
      const size_t row_bytes = dtype_row_bytes(type, k);
      std::vector<uint8_t> packed(row_bytes * rows), inter(row_bytes * rows);
      for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(packed.data() + r * row_bytes, p.w.data() + r * p.w_row_bytes, row_bytes);
  }
      if (interleavable(type)) interleave_groups(type, k, rows / kInterleaveRows, packed.data(), inter.data());
      // want: one activation row at a time (the dot kernels); want_gemm: as the m-row GEMM computes them.
      std::vector<float> want(rows * m), want_gemm(rows * m);
      for (int64_t t = 0; t < m; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          const uint8_t* a = p.act.data() + t * p.act_stride;
          want[t * rows + r] = definition(k, p.w.data() + r * p.w_row_bytes, a, false);
          want_gemm[t * rows + r] = definition(k, p.w.data() + r * p.w_row_bytes, a, t < m - m % 4);
          differs_from_vec_dot += want_gemm[t * rows + r] != vec_dot(k, p.w.data() + r * p.w_row_bytes, a);
        }
      }
      for (Isa isa : kAllIsas) {
        if (!isa_available(isa)) continue;
        const TypeKernels* tk = type_kernels(type, isa, MatmulOrder::kRepacked);
        ASSERT_NE(tk, nullptr);
        ASSERT_NE(tk, type_kernels(type, isa));
        const std::string what = std::string(dtype_name(type)) + " " + isa_name(isa) + " k " + std::to_string(k) +
                                 " m " + std::to_string(m);
        // dot, up to 4 activation rows per call.
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t t0 = 0; t0 < m; t0 += kMaxDotRows) {
            const int nr = static_cast<int>(std::min<int64_t>(kMaxDotRows, m - t0));
            float y[kMaxDotRows];
            tk->dot(k, p.w.data() + r * p.w_row_bytes, p.act.data() + t0 * p.act_stride, p.act_stride, nr, y);
            for (int i = 0; i < nr; ++i) ASSERT_EQ(y[i], want[(t0 + i) * rows + r]) << "dot " << what << " row " << r;
          }
        }
        // dot_w4: four rows against one activation row.
        if (tk->dot_w4 != nullptr) {
          for (int64_t t = 0; t < m; ++t) {
            for (int64_t r = 0; r < rows; r += 4) {
              float y[4];
              tk->dot_w4(k, p.w.data() + r * p.w_row_bytes, p.w_row_bytes, p.act.data() + t * p.act_stride, y);
              for (int i = 0; i < 4; ++i) ASSERT_EQ(y[i], want[t * rows + r + i]) << "dot_w4 " << what << " row " << r + i;
            }
          }
        }
        // dot_x16 on the interleaved groups.
        if (tk->dot_x16 != nullptr) {
          for (int64_t t = 0; t < m; ++t) {
            for (int64_t g = 0; g < rows / kInterleaveRows; ++g) {
              float y[kInterleaveRows];
              tk->dot_x16(k, inter.data() + g * kInterleaveRows * row_bytes, p.act.data() + t * p.act_stride, y);
              for (int i = 0; i < kInterleaveRows; ++i) {
                ASSERT_EQ(y[i], want[t * rows + g * kInterleaveRows + i]) << "dot_x16 " << what << " row " << g * 16 + i;
              }
            }
          }
        }
        // dot_x16_groups: all the groups in one call, and the last two.
        if (tk->dot_x16_groups != nullptr) {
          const int64_t groups = rows / kInterleaveRows;
          for (int64_t t = 0; t < m; ++t) {
            for (int64_t g0 : {int64_t{0}, groups - 2}) {
              std::vector<float> y((groups - g0) * kInterleaveRows);
              tk->dot_x16_groups(k, inter.data() + g0 * kInterleaveRows * row_bytes, kInterleaveRows * row_bytes,
                                 static_cast<int>(groups - g0), p.act.data() + t * p.act_stride, y.data());
              for (size_t i = 0; i < y.size(); ++i) {
                ASSERT_EQ(y[i], want[t * rows + g0 * kInterleaveRows + i])
                    << "dot_x16_groups " << what << " row " << g0 * 16 + i;
              }
            }
          }
        }
        // The GEMM, both layouts where the type has two, ragged ranges. The scalar ISA: Q4_K's definition (its rows
        // depend on their place in the batch); none for Q4_0 and IQ4_NL (their dot serves every row).
        expect_repacked_gemm(p, inter, row_bytes, isa, type == DType::kQ4_K, want_gemm, what);
      }
    }
  }
  // The two orders are different arithmetic (else this test would not tell them apart).
  EXPECT_GT(differs_from_vec_dot, 100) << dtype_name(type);
}

TEST(Gemm, RepackedOrderQ4_0EqualsItsDefinition) {
  EXPECT_EQ(matmul_order_for(DType::kQ4_0, 64, MatmulOrder::kRepacked), MatmulOrder::kRepacked);
  EXPECT_EQ(matmul_order_for(DType::kQ4_0, 60, MatmulOrder::kRepacked), MatmulOrder::kVecDot);  // rows % 8 != 0
  EXPECT_EQ(matmul_order_for(DType::kQ8_0, 64, MatmulOrder::kRepacked), MatmulOrder::kVecDot);
  EXPECT_EQ(matmul_order_for(DType::kQ4_0, 64, MatmulOrder::kVecDot), MatmulOrder::kVecDot);
  EXPECT_EQ(type_kernels(DType::kQ8_0, Isa::kAvx2, MatmulOrder::kRepacked), type_kernels(DType::kQ8_0, Isa::kAvx2));
  MatmulOrder parsed = MatmulOrder::kVecDot;
  EXPECT_TRUE(parse_matmul_order("repacked", &parsed));
  EXPECT_EQ(parsed, MatmulOrder::kRepacked);
  EXPECT_FALSE(parse_matmul_order("fast", &parsed));
  check_repacked_order(
      DType::kQ4_0, [](int64_t k, const uint8_t* w, const uint8_t* a, bool) { return repacked_dot(k, w, a); },
      [](int64_t k, const uint8_t* w, const uint8_t* a) { return contract_dot(DType::kQ4_0, k, w, a); },
      {32, 576, 2048 + 32, 16384 + 64 /* past one run of the GEMVs' block starts */}, 71);
}

TEST(Gemm, RepackedOrderIQ4_NLEqualsItsDefinition) {
  EXPECT_EQ(matmul_order_for(DType::kIQ4_NL, 64, MatmulOrder::kRepacked), MatmulOrder::kRepacked);
  EXPECT_EQ(matmul_order_for(DType::kIQ4_NL, 60, MatmulOrder::kRepacked), MatmulOrder::kVecDot);  // rows % 8 != 0
  check_repacked_order(
      DType::kIQ4_NL, [](int64_t k, const uint8_t* w, const uint8_t* a, bool) { return repacked_dot_iq4_nl(k, w, a); },
      [](int64_t k, const uint8_t* w, const uint8_t* a) {
        float y;
        type_kernels(DType::kIQ4_NL, Isa::kScalar)->dot(k, w, a, 0, 1, &y);
        return y;
      },
      {256, 2048 + 256}, 74);
}

TEST(Gemm, RepackedOrderQ4_KEqualsItsDefinition) {
  EXPECT_EQ(matmul_order_for(DType::kQ4_K, 64, MatmulOrder::kRepacked), MatmulOrder::kRepacked);
  EXPECT_EQ(matmul_order_for(DType::kQ4_K, 68, MatmulOrder::kRepacked), MatmulOrder::kVecDot);  // rows % 8 != 0
  EXPECT_EQ(matmul_order_for(DType::kQ5_1, 64, MatmulOrder::kRepacked), MatmulOrder::kVecDot);
  check_repacked_order(
      DType::kQ4_K, repacked_dot_q4_k,
      [](int64_t k, const uint8_t* w, const uint8_t* a) {
        float y;
        type_kernels(DType::kQ4_K, Isa::kScalar)->dot(k, w, a, 0, 1, &y);
        return y;
      },
      {256, 2048 + 256}, 72);
}

// llama.cpp's tiled K-quant GEMM for Q6_K, written from the block format: per super-block the exact total
// t = sum_e sc_(e/16) * (code_e - 32) * a_e and y = fma(float(t) * d, d_a, y).
float tiled_dot_q6_k(int64_t k, const uint8_t* w, const uint8_t* a) {
  float y = 0.0f;
  for (int64_t b = 0; b < k / kQK_K; ++b) {
    const auto& x = reinterpret_cast<const BlockQ6_K*>(w)[b];
    const auto& q8 = reinterpret_cast<const BlockQ8_K*>(a)[b];
    int total = 0;
    for (int e = 0; e < 256; ++e) {
      // ggml's dequantize_row_q6_K: element e of half n = e / 128, run j = (e % 128) / 32, position l = e % 32.
      const int n = e / 128, j = (e % 128) / 32, l = e % 32;
      const uint8_t lo = x.ql[64 * n + l + 32 * (j % 2)];
      const int code = (j < 2 ? lo & 0xF : lo >> 4) | (((x.qh[32 * n + l] >> (2 * j)) & 3) << 4);
      total += x.scales[e / 16] * (code - 32) * q8.qs[e];
    }
    y = std::fma(static_cast<float>(total) * fp16_to_fp32(x.d), q8.d, y);
  }
  return y;
}

// The types llama.cpp sends through its tiled K-quant GEMM, in the repacked order: from kTiledMinRows activation rows
// on every GEMM (each ISA, both layouts where the type has two, ragged row ranges) equals the tiled definition
// (scalar::tiled_dot; Q6_K's also tiled_dot_q6_k above, written from the block format) bit for bit; below, it equals
// that ISA's vec_dot kernel, as llama.cpp does. Decode (one activation row) keeps the vec_dot kernels.
TEST(Gemm, RepackedOrderOfTheTiledTypesIsTheTiledGemmFrom8Rows) {
  for (DType type : {DType::kQ3_K, DType::kQ5_K, DType::kQ6_K, DType::kIQ4_XS}) {
    EXPECT_EQ(matmul_order_for(type, 60, MatmulOrder::kRepacked), MatmulOrder::kRepacked) << dtype_name(type);
  }
  EXPECT_EQ(matmul_order_for(DType::kQ6_K, 64, MatmulOrder::kVecDot), MatmulOrder::kVecDot);
  // Q2_K: llama.cpp's AVX-512 build repacks the matrices whose row count is a multiple of 8 (not reproduced).
  {
    const GgmlOrder saved = ggml_order();
    set_ggml_order(GgmlOrder::kAvx2);
    EXPECT_EQ(matmul_order_for(DType::kQ2_K, 64, MatmulOrder::kRepacked), MatmulOrder::kRepacked);
    set_ggml_order(GgmlOrder::kAvx512);
    EXPECT_EQ(matmul_order_for(DType::kQ2_K, 64, MatmulOrder::kRepacked), MatmulOrder::kVecDot);
    EXPECT_EQ(matmul_order_for(DType::kQ2_K, 60, MatmulOrder::kRepacked), MatmulOrder::kRepacked);
    set_ggml_order(saved);
  }
  std::mt19937 rng(73);
  for (DType type : {DType::kQ2_K, DType::kQ3_K, DType::kQ5_K, DType::kQ6_K, DType::kIQ4_XS}) {
    EXPECT_EQ(type_kernels(type, Isa::kAvx2, MatmulOrder::kRepacked), type_kernels(type, Isa::kAvx2)) << dtype_name(type);
    const scalar::DotFn tiled = scalar::tiled_dot(type);
    ASSERT_NE(tiled, nullptr) << dtype_name(type);
    int differs_from_vec_dot = 0;
    for (int64_t k : {256, 2048 + 256}) {
      for (int64_t m : {2, 3, 7, 8, 9, 13, 70}) {
        const int64_t rows = 48;
        const Problem p = make_k_problem(rng, type, k, rows, m);
        const size_t row_bytes = dtype_row_bytes(type, k);
        std::vector<uint8_t> packed(row_bytes * rows), inter(row_bytes * rows);
        for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(packed.data() + r * row_bytes, p.w.data() + r * p.w_row_bytes, row_bytes);
  }
        if (interleavable(type)) interleave_groups(type, k, rows / kInterleaveRows, packed.data(), inter.data());
        for (Isa isa : kAllIsas) {
          if (!isa_available(isa)) continue;
          std::vector<float> want(rows * m);
          for (int64_t t = 0; t < m; ++t) {
            for (int64_t r = 0; r < rows; ++r) {
              const uint8_t* w = p.w.data() + r * p.w_row_bytes;
              const uint8_t* a = p.act.data() + t * p.act_stride;
              float vd, td;
              type_kernels(type, isa)->dot(k, w, a, 0, 1, &vd);
              tiled(k, w, a, 0, 1, &td);
              if (type == DType::kQ6_K) {
                ASSERT_EQ(td, tiled_dot_q6_k(k, w, a)) << "row " << r << " act " << t;
              }
              want[t * rows + r] = m >= kTiledMinRows ? td : vd;
              differs_from_vec_dot += td != vd;
            }
          }
          expect_repacked_gemm(p, inter, row_bytes, isa, true, want,
                               std::string(dtype_name(type)) + " " + isa_name(isa) + " k " + std::to_string(k) + " m " +
                                   std::to_string(m));
        }
      }
    }
    // The two orders are different arithmetic (else this test would not tell them apart).
    EXPECT_GT(differs_from_vec_dot, 100) << dtype_name(type);
  }
}

TEST(Gemm, EmptyRangesWriteNothing) {
  std::mt19937 rng(9);
  const Problem p = make_problem(rng, DType::kQ4_0, 64, 8, 3);
  for (Isa isa : kAllIsas) {
    if (!isa_available(isa) || gemm_kernel(DType::kQ4_0, isa) == nullptr) continue;
    const std::vector<float> out = run(gemm_kernel(DType::kQ4_0, isa), p, 4, 4, false, false);
    for (float v : out) EXPECT_EQ(v, kSentinel);
  }
}

}  // namespace
}  // namespace inferd::kernels
