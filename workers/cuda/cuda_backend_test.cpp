// The CUDA backend as a whole: refusals without a device, and with one, models on it against the CPU
// engine (teacher-forced top-1 agreement on SmolLM2's English text and on the committed synthetic
// models, plus any listed in INFERD_CUDA_TEST_MODELS, colon-separated), the engine's own consistency
// (prefill against token-by-token decode, two slots in one batch), a two-stage pipeline (the first
// layers on the GPU, the rest on the CPU) against the whole model, and a KV cache too large for the
// device refused with nothing left allocated. Tests that need a device skip without one, saying why.
// Its operators, every type and odd size, are in the backend-ops suite (tests/backend_ops_test.cpp).
#include "inferd/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "inferd/backend_factory.h"
#include "inferd/engine.h"
#include "inferd/kernels/cpu.h"
#include "inferd/kernels/cuda.h"
#include "inferd/kernels/test_weights.h"
#include "inferd/model_runner.h"
#include "inferd/tokenizer.h"

namespace inferd {
const BackendFactory& cuda_backend_factory();
}

namespace inferd::cuda {
namespace {

// Exact CUDA numerics reproduce the CPU engine in the vec_dot matmul order (kernels::MatmulOrder), not in the
// default repacked one: every test here runs the CPU side in that order.
const kernels::ScopedMatmulOrder kVecDotOrder(kernels::MatmulOrder::kVecDot);

const char* kText = INFERD_TEST_DATA_DIR "/text/english.txt";

int argmax(std::span<const float> v) { return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin()); }

std::string no_device_reason() {
  auto d = query_device(0);
  return d ? std::string() : d.status().message();
}

TEST(CudaDevice, WithoutADeviceTheBackendIsRefusedWithTheReason) {
  if (device_count() > 0) {
    // With a device: an index past the last is refused, naming how many there are.
    auto b = CudaBackend::create(CudaOptions{device_count(), MatmulPath::kGemv, Activations::kFloat, std::nullopt});
    ASSERT_FALSE(b.is_ok());
    EXPECT_EQ(b.status().code(), Code::kNotFound);
    EXPECT_NE(b.status().message().find("does not exist"), std::string::npos) << b.status().to_string();
    return;
  }
  auto b = cuda_backend_factory().create(BackendConfig{});
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.status().code(), Code::kNotFound);
  EXPECT_NE(b.status().message().find("no CUDA device"), std::string::npos) << b.status().to_string();
  std::printf("[cuda] no device here: %s\n", b.status().message().c_str());
}

TEST(CudaDevice, BadSettingsAreRefusedNamingTheVariable) {
  auto b = cuda_backend_factory().create(BackendConfig{"", 0, {{"matmul", "fast"}}});
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.status().code(), Code::kInvalidArgument);
  EXPECT_NE(b.status().message().find("INFERD_CUDA_MATMUL"), std::string::npos) << b.status().to_string();
  auto c = cuda_backend_factory().create(BackendConfig{"", 0, {{"numerics", "fast"}}});
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  EXPECT_NE(c.status().message().find("INFERD_CUDA_NUMERICS"), std::string::npos) << c.status().to_string();
  // Exact numerics have their own matmul: tensor cores or q8 inputs with them are a contradiction.
  auto e = cuda_backend_factory().create(BackendConfig{"", 0, {{"numerics", "exact"}, {"matmul", "tensor_cores"}}});
  ASSERT_FALSE(e.is_ok());
  EXPECT_EQ(e.status().code(), Code::kInvalidArgument);
  EXPECT_NE(e.status().message().find("INFERD_CUDA_NUMERICS"), std::string::npos) << e.status().to_string();
  auto d = cuda_backend_factory().create(BackendConfig{"gpu0", 0, {}});
  ASSERT_FALSE(d.is_ok());
  EXPECT_EQ(d.status().code(), Code::kInvalidArgument);
  auto f = cuda_backend_factory().create(BackendConfig{"", 0, {{"fuse", "maybe"}}});
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().code(), Code::kInvalidArgument);
  EXPECT_NE(f.status().message().find("INFERD_CUDA_FUSE"), std::string::npos) << f.status().to_string();
  auto a = cuda_backend_factory().create(BackendConfig{"", 0, {{"split_attention", "yes"}}});
  ASSERT_FALSE(a.is_ok());
  EXPECT_EQ(a.status().code(), Code::kInvalidArgument);
  EXPECT_NE(a.status().message().find("INFERD_CUDA_SPLIT_ATTENTION"), std::string::npos) << a.status().to_string();
  auto q = cuda_backend_factory().create(BackendConfig{"", 0, {{"q6k_integer", "1"}}});
  ASSERT_FALSE(q.is_ok());
  EXPECT_EQ(q.status().code(), Code::kInvalidArgument);
  EXPECT_NE(q.status().message().find("INFERD_CUDA_Q6K_INTEGER"), std::string::npos) << q.status().to_string();
}

// ---- Kernels on the device -----------------------------------------------------------------------------

// Device memory for a test, rounded up to 16 bytes as the backend's allocations are (cuda.h, Matrix).
struct DeviceMemory {
  void* p = nullptr;
  explicit DeviceMemory(size_t bytes) {
    if (cudaMalloc(&p, (std::max<size_t>(bytes, 16) + 15) / 16 * 16) != cudaSuccess) p = nullptr;
  }
  ~DeviceMemory() {
    if (p != nullptr) (void)cudaFree(p);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

std::vector<float> download(const float* d, size_t n) {
  std::vector<float> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

size_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

// `count` matrices of `rows` rows of k random values of `type` in one host buffer, matrix i at i * stride
// (256-byte aligned: the fused kernels read 16-byte vectors), the last one ending at the buffer's end.
struct HostMatrices {
  size_t row_bytes = 0, stride = 0;
  std::vector<uint8_t> bytes;
};
HostMatrices random_matrices(DType type, int64_t k, int64_t rows, int count, std::mt19937& rng) {
  HostMatrices h;
  h.row_bytes = dtype_row_bytes(type, k);
  h.stride = (static_cast<size_t>(rows) * h.row_bytes + 255) / 256 * 256;
  h.bytes.resize(static_cast<size_t>(count - 1) * h.stride + static_cast<size_t>(rows) * h.row_bytes);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(k));
  for (int64_t r = 0; r < count * rows; ++r) {
    for (float& v : values) v = normal(rng);
    kernels::testing::encode_weight_row(type, values.data(), k, static_cast<uint32_t>(r), 3.0f,
                                        h.bytes.data() + static_cast<size_t>(r / rows) * h.stride +
                                            static_cast<size_t>(r % rows) * h.row_bytes);
  }
  return h;
}

// The staged GEMV (path 1: rows through shared memory, in segments, from any row alignment) against the
// unstaged one (path 3), and the fused GEMVs against separate launches, bit for bit: every weight type,
// rows narrower than a segment and unaligned (576 values), rows of several segments (9,216), 1-8 tokens.
TEST(CudaKernels, StagedAndFusedGemvsEqualTheUnstagedGemv) {
  const std::string why = no_device_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const DType types[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,
                         DType::kQ5_0, DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
  constexpr int64_t kRows = 67;
  for (DType type : types) {
    for (int64_t k : {int64_t{576}, int64_t{9216}}) {
      if (k % dtype_info(type)->block_size != 0) continue;
      SCOPED_TRACE(std::string(dtype_name(type)) + " k=" + std::to_string(k));
      // Three matrices (Q, K, V or gate, up and a third) in one allocation (an unaligned matrix would run
      // the separate kernels instead).
      std::mt19937 rng(static_cast<uint32_t>(k) * 131 + static_cast<uint32_t>(type));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      const HostMatrices hm = random_matrices(type, k, kRows, 3, rng);
      const size_t row_bytes = hm.row_bytes, stride = hm.stride;
      const std::vector<uint8_t>& host = hm.bytes;
      DeviceMemory w(host.size()), x(8 * static_cast<size_t>(k) * 4), bias(kRows * 4);
      DeviceMemory y1(8 * kRows * 4), y3(8 * kRows * 4), ys(3 * 8 * kRows * 4), yg(8 * kRows * 4);
      ASSERT_NE(w.p, nullptr);
      ASSERT_EQ(cudaMemcpy(w.p, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
      std::vector<float> xs(8 * static_cast<size_t>(k)), bs(kRows);
      for (float& v : xs) v = normal(rng);
      for (float& v : bs) v = normal(rng);
      ASSERT_EQ(cudaMemcpy(x.p, xs.data(), xs.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(bias.p, bs.data(), bs.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      Matrix m[3];
      for (int i = 0; i < 3; ++i) {
        m[i] = Matrix{static_cast<WType>(type), w.as<uint8_t>() + static_cast<size_t>(i) * stride, row_bytes, kRows, k};
      }
      for (int32_t tokens : {1, 2, 3, 5, 8}) {
        SCOPED_TRACE("tokens " + std::to_string(tokens));
        const size_t out = static_cast<size_t>(tokens) * kRows;
        // The last matrix of the three: its last row ends at the allocation's end.
        ASSERT_EQ(matmul_path(1, m[2], x.as<float>(), tokens, bias.as<float>(), nullptr, y1.as<float>(), nullptr),
                  cudaSuccess);
        ASSERT_EQ(matmul_path(3, m[2], x.as<float>(), tokens, bias.as<float>(), nullptr, y3.as<float>(), nullptr),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> unstaged = download(y3.as<float>(), out);
        EXPECT_EQ(differing(download(y1.as<float>(), out), unstaged), 0u) << "staged vs unstaged";
        const bool fusable = fused_gemv_applies(m[0], x.as<float>(), tokens) &&
                             fused_gemv_applies(m[1], x.as<float>(), tokens) &&
                             fused_gemv_applies(m[2], x.as<float>(), tokens);
        if (!fusable) {
          // Where the fused kernels do not apply they refuse, and the callers run the separate ones.
          MatmulOut outs[3] = {{m[0], nullptr, ys.as<float>()}, {m[1], nullptr, ys.as<float>()}, {m[2], nullptr, ys.as<float>()}};
          EXPECT_EQ(matmul_many(outs, 3, x.as<float>(), tokens, nullptr), cudaErrorInvalidValue);
          continue;
        }
        // Q, K and V in one launch (biases on the last) against three launches.
        MatmulOut outs[3];
        for (int i = 0; i < 3; ++i) {
          outs[i] = MatmulOut{m[i], i == 2 ? bias.as<float>() : nullptr, ys.as<float>() + static_cast<size_t>(i) * out};
        }
        ASSERT_EQ(matmul_many(outs, 3, x.as<float>(), tokens, nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(differing(download(ys.as<float>() + 2 * out, out), unstaged), 0u) << "matmul_many";
        // Gate and up with SwiGLU in one launch against two matmuls and swiglu().
        ASSERT_EQ(matmul_path(3, m[0], x.as<float>(), tokens, nullptr, nullptr, y1.as<float>(), nullptr), cudaSuccess);
        ASSERT_EQ(matmul_path(3, m[1], x.as<float>(), tokens, nullptr, nullptr, y3.as<float>(), nullptr), cudaSuccess);
        ASSERT_EQ(swiglu(y1.as<float>(), y3.as<float>(), static_cast<int64_t>(out), y1.as<float>(), nullptr),
                  cudaSuccess);
        ASSERT_EQ(matmul_glu(Glu::kSilu, m[0], m[1], x.as<float>(), tokens, nullptr, yg.as<float>(), nullptr),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(differing(download(yg.as<float>(), out), download(y1.as<float>(), out)), 0u) << "matmul_glu";
      }
    }
  }
}

// The integer GEMV (8-bit inputs, dp4a) against a host reference computed from the same codes: the
// quantized inputs equal the CPU engine's q8_0 codes with an fp16-rounded scale; every output is
// sum over blocks of d_w * d_x * (integer dot) within float rounding of that sum; a token's output is
// the same bits alone or in a step of 13 (batch-invariant); matmul_many_q8 and matmul_glu_q8 equal the
// separate launches bit for bit. Rows narrower than a segment (576 values; 2,816: 11 Q4_K/Q6_K super-blocks,
// Q6_K rows 2 bytes past a word) and of several (9,216). Q6_K: per-16 scales (d * sc of each half).
TEST(CudaKernels, IntegerGemvEqualsItsReferenceAndIsBatchInvariant) {
  const std::string why = no_device_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  constexpr int64_t kRows = 67;
  constexpr int32_t kTokens = 13;
  for (DType type : {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    for (int64_t k : {int64_t{576}, int64_t{2816}, int64_t{9216}}) {
      if (k % dtype_info(type)->block_size != 0) continue;
      SCOPED_TRACE(std::string(dtype_name(type)) + " k=" + std::to_string(k));
      std::mt19937 rng(static_cast<uint32_t>(k) * 7 + static_cast<uint32_t>(type));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      const HostMatrices hm = random_matrices(type, k, kRows, 3, rng);
      const size_t row_bytes = hm.row_bytes, stride = hm.stride;
      const std::vector<uint8_t>& host = hm.bytes;
      std::vector<float> xs(static_cast<size_t>(kTokens) * static_cast<size_t>(k)), bs(kRows);
      for (float& v : xs) v = normal(rng);
      for (float& v : bs) v = normal(rng);
      const size_t qbytes = q8_input_bytes(kTokens, k);
      DeviceMemory w(host.size()), x(xs.size() * 4), xq(qbytes), xq1(q8_input_bytes(1, k)), bias(kRows * 4);
      DeviceMemory y(kTokens * kRows * 4), y1(kRows * 4), ys(3 * kTokens * kRows * 4), yg(kTokens * kRows * 4),
          ya(kTokens * kRows * 4), yb(kTokens * kRows * 4);
      ASSERT_NE(w.p, nullptr);
      ASSERT_EQ(cudaMemcpy(w.p, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(x.p, xs.data(), xs.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(bias.p, bs.data(), bs.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      Matrix m[3];
      for (int i = 0; i < 3; ++i) {
        m[i] = Matrix{static_cast<WType>(type), w.as<uint8_t>() + static_cast<size_t>(i) * stride, row_bytes, kRows, k};
        ASSERT_TRUE(q8_gemv_applies(m[i]));
      }
      ASSERT_EQ(quantize_q8_input(x.as<float>(), kTokens, k, xq.p, nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<uint8_t> q(qbytes);
      ASSERT_EQ(cudaMemcpy(q.data(), xq.p, qbytes, cudaMemcpyDeviceToHost), cudaSuccess);
      const auto* codes = reinterpret_cast<const int8_t*>(q.data());
      const uint8_t* scales = q.data() + static_cast<size_t>(kTokens) * static_cast<size_t>(k);
      const int64_t nb = k / 32;
      // The codes: the CPU engine's q8_0 arithmetic (round(x * 127 / amax)), the scale amax / 127 in fp16.
      size_t bad_codes = 0;
      for (int64_t b = 0; b < kTokens * nb; ++b) {
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xs[static_cast<size_t>(b * 32 + i)]));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < 32; ++i) {
          const int c = static_cast<int>(std::nearbyint(xs[static_cast<size_t>(b * 32 + i)] * id));
          bad_codes += c != codes[b * 32 + i];
          sum += c;
        }
        float d = 0.0f;
        int32_t dsum = 0;
        std::memcpy(&d, scales + b * 8, 4);
        std::memcpy(&dsum, scales + b * 8 + 4, 4);
        EXPECT_EQ(d, kernels::fp16_to_fp32(kernels::fp32_to_fp16(amax / 127.0f))) << "block " << b;
        EXPECT_EQ(dsum, sum) << "block " << b;
      }
      EXPECT_EQ(bad_codes, 0u);
      // Every output against sum_b d_w d_x dot_b in double, within float rounding of the sum of |terms|.
      ASSERT_EQ(matmul_q8(m[2], xq.p, kTokens, bias.as<float>(), nullptr, y.as<float>(), nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> got = download(y.as<float>(), static_cast<size_t>(kTokens) * kRows);
      const auto half = [](const uint8_t* p) {
        uint16_t h = 0;
        std::memcpy(&h, p, 2);
        return static_cast<double>(kernels::fp16_to_fp32(h));
      };
      // A 32-value block of a row of the 32-value types and Q4_K: its codes (Q4_0's less 8), scale and offset (a
      // value is d * code + m).
      const auto block32_of = [&](const uint8_t* row, int64_t b, int (&wq)[32], double* dw, double* mw) {
        *mw = 0.0;
        if (type == DType::kQ4_K) {
          const uint8_t* sb = row + static_cast<size_t>(b / 8) * 144;
          const int j = static_cast<int>(b % 8);
          const uint8_t* sc = sb + 4;
          const int scale = j < 4 ? sc[j] & 63 : (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
          const int mn = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
          *dw = half(sb) * scale;
          *mw = -(half(sb + 2) * mn);
          for (int i = 0; i < 32; ++i) {
            const uint8_t byte = sb[16 + 32 * (j / 2) + i];
            wq[i] = j % 2 == 0 ? byte & 0xF : byte >> 4;
          }
          return;
        }
        const uint8_t* blk = row + static_cast<size_t>(b) * dtype_row_bytes(type, 32);
        *dw = half(blk);
        if (type == DType::kQ4_1) *mw = half(blk + 2);
        for (int i = 0; i < 32; ++i) {
          if (type == DType::kQ8_0) {
            wq[i] = static_cast<int8_t>(blk[2 + i]);
          } else {
            const uint8_t byte = blk[(type == DType::kQ4_0 ? 2 : 4) + i % 16];
            wq[i] = i < 16 ? (byte & 0xF) : (byte >> 4);
            if (type == DType::kQ4_0) wq[i] -= 8;
          }
        }
      };
      // Any block: its codes (Q6_K's less 32), the scale of each 16-value half, the offset.
      const auto block_of = [&](const uint8_t* row, int64_t b, int (&wq)[32], double (&dwh)[2], double* mw) {
        if (type != DType::kQ6_K) {
          block32_of(row, b, wq, &dwh[0], mw);
          dwh[1] = dwh[0];
          return;
        }
        *mw = 0.0;
        const uint8_t* sb = row + static_cast<size_t>(b / 8) * 210;
        const int j = static_cast<int>(b % 8), n = j / 4, qd = j % 4;
        for (int i = 0; i < 32; ++i) {
          const int lo = (sb[64 * n + 32 * (qd % 2) + i] >> (qd >= 2 ? 4 : 0)) & 0xF;
          const int hi = (sb[128 + 32 * n + i] >> (2 * qd)) & 3;
          wq[i] = (lo | hi << 4) - 32;
        }
        for (int h = 0; h < 2; ++h) dwh[h] = half(sb + 208) * static_cast<int8_t>(sb[192 + 8 * n + 2 * qd + h]);
      };
      size_t off = 0;
      for (int32_t t = 0; t < kTokens; ++t) {
        for (int64_t r = 0; r < kRows; ++r) {
          const uint8_t* row = host.data() + 2 * stride + static_cast<size_t>(r) * row_bytes;
          double want = 0.0, mag = 0.0;
          for (int64_t b = 0; b < nb; ++b) {
            int wq[32];
            double dwh[2] = {0.0, 0.0}, mw = 0.0;
            block_of(row, b, wq, dwh, &mw);
            float dx = 0.0f;
            int32_t sx = 0;
            std::memcpy(&dx, scales + (t * nb + b) * 8, 4);
            std::memcpy(&sx, scales + (t * nb + b) * 8 + 4, 4);
            for (int h = 0; h < 2; ++h) {
              int64_t dot = 0;
              for (int i = 16 * h; i < 16 * h + 16; ++i) dot += static_cast<int64_t>(wq[i]) * codes[(t * nb + b) * 32 + i];
              want += dwh[h] * dx * static_cast<double>(dot);
              mag += std::fabs(dwh[h] * dx * static_cast<double>(dot));
            }
            want += mw * dx * sx;
            mag += std::fabs(mw * dx * sx);
          }
          want += bs[static_cast<size_t>(r)];
          const double g = got[static_cast<size_t>(t) * kRows + static_cast<size_t>(r)];
          if (std::fabs(g - want) > 4e-6 * (mag + std::fabs(bs[static_cast<size_t>(r)])) + 1e-30) ++off;
        }
      }
      EXPECT_EQ(off, 0u) << "outputs off the reference";
      // A token alone equals the same token in the 13-token step, bit for bit.
      for (int32_t t : {0, 5, 12}) {
        ASSERT_EQ(quantize_q8_input(x.as<float>() + static_cast<size_t>(t) * k, 1, k, xq1.p, nullptr), cudaSuccess);
        ASSERT_EQ(matmul_q8(m[2], xq1.p, 1, bias.as<float>(), nullptr, y1.as<float>(), nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> alone = download(y1.as<float>(), kRows);
        EXPECT_EQ(differing(alone, std::vector<float>(got.begin() + t * kRows, got.begin() + (t + 1) * kRows)), 0u)
            << "token " << t;
      }
      // Fused launches against separate ones, 13 tokens and 3.
      for (int32_t tokens : {kTokens, 3}) {
        SCOPED_TRACE("fused, tokens " + std::to_string(tokens));
        const size_t out = static_cast<size_t>(tokens) * kRows;
        ASSERT_EQ(quantize_q8_input(x.as<float>(), tokens, k, xq.p, nullptr), cudaSuccess);
        MatmulOut outs[3];
        for (int i = 0; i < 3; ++i) {
          outs[i] = MatmulOut{m[i], i == 2 ? bias.as<float>() : nullptr, ys.as<float>() + static_cast<size_t>(i) * out};
        }
        ASSERT_EQ(matmul_many_q8(outs, 3, xq.p, tokens, nullptr), cudaSuccess);
        ASSERT_EQ(matmul_q8(m[2], xq.p, tokens, bias.as<float>(), nullptr, y.as<float>(), nullptr), cudaSuccess);
        ASSERT_EQ(matmul_q8(m[0], xq.p, tokens, nullptr, nullptr, ya.as<float>(), nullptr), cudaSuccess);
        ASSERT_EQ(matmul_q8(m[1], xq.p, tokens, nullptr, nullptr, yb.as<float>(), nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(differing(download(ys.as<float>() + 2 * out, out), download(y.as<float>(), out)), 0u) << "many V";
        EXPECT_EQ(differing(download(ys.as<float>(), out), download(ya.as<float>(), out)), 0u) << "many Q";
        ASSERT_EQ(swiglu(ya.as<float>(), yb.as<float>(), static_cast<int64_t>(out), ya.as<float>(), nullptr),
                  cudaSuccess);
        ASSERT_EQ(matmul_glu_q8(Glu::kSilu, m[0], m[1], xq.p, tokens, nullptr, yg.as<float>(), nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(differing(download(yg.as<float>(), out), download(ya.as<float>(), out)), 0u) << "glu";
      }
      // A launch over many rows (more than the device holds warps at once) against launches over slices of 67
      // of them, bit for bit: a row's sums do not depend on the launch it is in.
      if (k == 9216) {
        constexpr int64_t kBig = 12000;
        const std::vector<uint8_t> big = random_matrices(type, k, kBig, 1, rng).bytes;
        DeviceMemory wb(big.size()), yb_all(static_cast<size_t>(kTokens) * kBig * 4);
        ASSERT_NE(wb.p, nullptr);
        ASSERT_EQ(cudaMemcpy(wb.p, big.data(), big.size(), cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(quantize_q8_input(x.as<float>(), kTokens, k, xq.p, nullptr), cudaSuccess);
        const Matrix whole{static_cast<WType>(type), wb.p, row_bytes, kBig, k};
        ASSERT_EQ(matmul_q8(whole, xq.p, kTokens, nullptr, nullptr, yb_all.as<float>(), nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> all = download(yb_all.as<float>(), static_cast<size_t>(kTokens) * kBig);
        // Slices start 16-byte aligned (q8_gemv_applies): Q6_K rows are 8 bytes past a multiple of 16.
        const bool even = type == DType::kQ6_K;
        for (int64_t r0 : {int64_t{0}, even ? int64_t{5002} : int64_t{5003}, even ? kBig - kRows - 1 : kBig - kRows}) {
          const Matrix slice{static_cast<WType>(type), wb.as<uint8_t>() + static_cast<size_t>(r0) * row_bytes, row_bytes,
                             kRows, k};
          ASSERT_TRUE(q8_gemv_applies(slice));
          ASSERT_EQ(matmul_q8(slice, xq.p, kTokens, nullptr, nullptr, y.as<float>(), nullptr), cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const std::vector<float> part = download(y.as<float>(), static_cast<size_t>(kTokens) * kRows);
          size_t differ = 0;
          for (int32_t t = 0; t < kTokens; ++t) {
            for (int64_t r = 0; r < kRows; ++r) {
              differ += std::memcmp(&part[static_cast<size_t>(t * kRows + r)],
                                    &all[static_cast<size_t>(t * kBig + r0 + r)], sizeof(float)) != 0;
            }
          }
          EXPECT_EQ(differ, 0u) << "rows from " << r0;
        }
      }
      // A matrix it cannot read is refused: rows padded past their blocks, or (32-value blocks) a row of 32
      // values, not whole pairs.
      const Matrix padded{static_cast<WType>(type), w.p, row_bytes + 16, kRows / 2, k};
      EXPECT_FALSE(q8_gemv_applies(padded));
      EXPECT_EQ(matmul_q8(padded, xq.p, 1, nullptr, nullptr, y.as<float>(), nullptr), cudaErrorInvalidValue);
      if (dtype_info(type)->block_size == 32) {
        const Matrix narrow{static_cast<WType>(type), w.p, dtype_row_bytes(type, 32), kRows, 32};
        EXPECT_FALSE(q8_gemv_applies(narrow));
      }
    }
  }
}

// The norm with its output quantized in the same launch equals rms_norm() then quantize_q8_input(), bit for
// bit (the float output and the codes, scales and sums).
TEST(CudaKernels, NormWithQuantizedOutputEqualsNormThenQuantize) {
  const std::string why = no_device_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  for (int64_t cols : {int64_t{576}, int64_t{2048}, int64_t{4096}}) {
    SCOPED_TRACE("cols " + std::to_string(cols));
    constexpr int32_t kRowsN = 5;
    std::mt19937 rng(static_cast<uint32_t>(cols));
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<float> xs(static_cast<size_t>(kRowsN * cols)), ws(static_cast<size_t>(cols));
    for (float& v : xs) v = normal(rng);
    for (float& v : ws) v = normal(rng);
    const size_t n = xs.size(), qb = q8_input_bytes(kRowsN, cols);
    DeviceMemory x(n * 4), w(ws.size() * 4), y1(n * 4), y2(n * 4), q1(qb), q2(qb);
    ASSERT_EQ(cudaMemcpy(x.p, xs.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(w.p, ws.data(), ws.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(rms_norm(x.as<float>(), w.as<float>(), kRowsN, cols, 1e-5f, y1.as<float>(), nullptr), cudaSuccess);
    ASSERT_EQ(quantize_q8_input(y1.as<float>(), kRowsN, cols, q1.p, nullptr), cudaSuccess);
    ASSERT_EQ(rms_norm_q8(x.as<float>(), w.as<float>(), kRowsN, cols, 1e-5f, y2.as<float>(), q2.p, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(differing(download(y1.as<float>(), n), download(y2.as<float>(), n)), 0u) << "norm output";
    std::vector<uint8_t> a(qb), b(qb);
    ASSERT_EQ(cudaMemcpy(a.data(), q1.p, qb, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(b.data(), q2.p, qb, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), qb), 0) << "codes, scales and sums";
  }
}

// Split attention (parts of KV blocks merged) against one thread block per head: within float rounding of
// each other, head dims 64, 128 and 256, GQA, a sliding window, positions from 0 to past 16 parts of
// 64; and a token alone gives the bits it gives in a step of many (the parts follow its positions only),
// also when the step runs in several launches (scratch for fewer tokens than the step).
TEST(CudaKernels, SplitAttentionAgreesWithOneBlockPerHead) {
  const std::string why = no_device_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  for (int32_t head_dim : {64, 128, 256}) {
    for (int32_t window : {0, 100}) {
      SCOPED_TRACE("head_dim " + std::to_string(head_dim) + " window " + std::to_string(window));
      constexpr int32_t kHeads = 8, kKvHeads = 2, kCtx = 1152, kSlots = 2;
      KvLayout kv;
      kv.blocks_per_slot = kCtx / kKvBlockTokens;
      kv.n_blocks = kSlots * kv.blocks_per_slot;
      kv.n_ctx = kCtx;
      kv.n_head_kv = kKvHeads;
      kv.head_dim = head_dim;
      std::mt19937 rng(static_cast<uint32_t>(head_dim * 7 + window));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<uint16_t> cache(kv.half_elems());
      for (uint16_t& h : cache) h = kernels::fp32_to_fp16(normal(rng));
      // Slot 1's blocks in reverse order: the table is followed, not assumed.
      std::vector<int32_t> table(static_cast<size_t>(kv.n_blocks));
      for (int32_t b = 0; b < kv.blocks_per_slot; ++b) {
        table[static_cast<size_t>(b)] = b;
        table[static_cast<size_t>(kv.blocks_per_slot + b)] = kv.n_blocks - 1 - b;
      }
      const std::vector<int32_t> positions = {0, 1, 63, 64, 65, 200, 511, 640, 1023, 1024, 1100, kCtx - 1};
      const int32_t tokens = static_cast<int32_t>(positions.size());
      std::vector<int32_t> slots(positions.size());
      for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int32_t>(i % 2);
      std::vector<float> qs(static_cast<size_t>(tokens) * kHeads * head_dim);
      for (float& v : qs) v = normal(rng) * 0.3f;
      DeviceMemory dc(cache.size() * 2), dt(table.size() * 4), dp(positions.size() * 4), ds(slots.size() * 4),
          dq(qs.size() * 4), o1(qs.size() * 4), o2(qs.size() * 4), o3(qs.size() * 4),
          parts(attention_split_scratch_floats(kHeads, head_dim, tokens) * 4);
      ASSERT_EQ(cudaMemcpy(dc.p, cache.data(), cache.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dt.p, table.data(), table.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dp.p, positions.data(), positions.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(ds.p, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dq.p, qs.data(), qs.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      ASSERT_EQ(attention(kv, kHeads, dq.as<float>(), dp.as<int32_t>(), ds.as<int32_t>(), dt.as<int32_t>(), tokens,
                          scale, 0.0f, window, dc.as<uint16_t>(), o1.as<float>(), nullptr),
                cudaSuccess);
      ASSERT_EQ(attention_split(kv, kHeads, dq.as<float>(), dp.as<int32_t>(), ds.as<int32_t>(), dt.as<int32_t>(),
                                tokens, scale, 0.0f, window, dc.as<uint16_t>(), parts.as<float>(), tokens,
                                o2.as<float>(), nullptr),
                cudaSuccess);
      // The same step in launches of 5 tokens.
      ASSERT_EQ(attention_split(kv, kHeads, dq.as<float>(), dp.as<int32_t>(), ds.as<int32_t>(), dt.as<int32_t>(),
                                tokens, scale, 0.0f, window, dc.as<uint16_t>(), parts.as<float>(), 5, o3.as<float>(),
                                nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> one = download(o1.as<float>(), qs.size()), split = download(o2.as<float>(), qs.size());
      EXPECT_EQ(differing(download(o3.as<float>(), qs.size()), split), 0u) << "launches of 5 tokens";
      double worst = 0.0;
      for (size_t i = 0; i < one.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(one[i]) - split[i]));
      EXPECT_LT(worst, 2e-5) << "split vs one block per head";
      // Each token alone, bit for bit.
      for (int32_t t = 0; t < tokens; t += 3) {
        ASSERT_EQ(attention_split(kv, kHeads, dq.as<float>() + static_cast<size_t>(t) * kHeads * head_dim,
                                  dp.as<int32_t>() + t, ds.as<int32_t>() + t, dt.as<int32_t>(), 1, scale, 0.0f, window,
                                  dc.as<uint16_t>(), parts.as<float>(), 1, o3.as<float>(), nullptr),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const size_t w = static_cast<size_t>(kHeads) * head_dim;
        EXPECT_EQ(differing(download(o3.as<float>(), w),
                            std::vector<float>(split.begin() + static_cast<std::ptrdiff_t>(t * w),
                                               split.begin() + static_cast<std::ptrdiff_t>((t + 1) * w))),
                  0u)
            << "token " << t << " alone";
      }
    }
  }
}

// ---- Models on the device ------------------------------------------------------------------------------

std::vector<std::string> model_files() {
  // The llama and qwen2 layouts, and the architectures past them (gemma3: Q/K norms per head, scaled
  // embeddings, GeGLU, sliding-window layers with a RoPE base of their own, Q scaled before its rounding;
  // qwen3: Q/K norms; phi3: fused QKV and gate/up as row ranges; llama3: RoPE frequency factors).
  std::vector<std::string> out = {INFERD_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                                  INFERD_TEST_DATA_DIR "/models/mixed-small.gguf",
                                  INFERD_TEST_DATA_DIR "/models/qwen2-small.gguf",
                                  INFERD_TEST_DATA_DIR "/models/gemma3-small.gguf",
                                  INFERD_TEST_DATA_DIR "/models/qwen3-small.gguf",
                                  INFERD_TEST_DATA_DIR "/models/phi3-small.gguf",
                                  INFERD_TEST_DATA_DIR "/models/llama3-small.gguf"};
  if (const char* extra = std::getenv("INFERD_CUDA_TEST_MODELS")) {
    std::stringstream ss(extra);
    std::string item;
    while (std::getline(ss, item, ':')) {
      if (!item.empty()) out.push_back(item);
    }
  }
  return out;
}

class CudaEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string why = no_device_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    if (!std::filesystem::exists(GetParam())) GTEST_SKIP() << "model not found: " << GetParam();
    auto m = Model::open(GetParam());
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    model_ = m.value();
  }

  Result<std::unique_ptr<ModelRunner>> runner(int32_t n_slots = 1, int32_t n_ctx = 512, int32_t first = 0,
                                              int32_t end = 0, CudaOptions options = CudaOptions{},
                                              int32_t n_blocks = 0) {
    auto b = CudaBackend::create(options);
    if (!b) return b.status();
    RunnerOptions o;
    o.n_ctx = n_ctx;
    o.n_slots = n_slots;
    o.n_blocks = n_blocks;
    o.first_layer = first;
    o.end_layer = end;
    auto r = ModelRunner::create(model_, std::move(b).value(), o);
    if (r) std::printf("[cuda] %s\n", r.value()->backend().describe().c_str());
    return r;
  }

  // Text tokens for a model with a real vocabulary; pseudo-random ids for a synthetic one.
  std::vector<int32_t> tokens(size_t n) const {
    std::vector<int32_t> ids;
    if (GetParam().find("SmolLM2") != std::string::npos) {
      std::ifstream in(kText);
      std::stringstream ss;
      ss << in.rdbuf();
      auto tok = Tokenizer::from_gguf(model_->file());
      EXPECT_TRUE(tok.is_ok()) << tok.status().to_string();
      if (tok) ids = tok.value()->encode(ss.str(), /*add_special=*/true, /*parse_special=*/false);
    }
    uint32_t s = 12345;
    while (ids.size() < n) {
      s = s * 1664525u + 1013904223u;
      ids.push_back(static_cast<int32_t>((s >> 8) % static_cast<uint32_t>(model_->config().n_vocab)));
    }
    ids.resize(n);
    return ids;
  }

  std::vector<float> cpu_logits(std::span<const int32_t> t) const {
    EngineOptions co;
    co.n_ctx = 512;
    co.n_threads = 0;
    auto cpu = Engine::create(model_, co);
    EXPECT_TRUE(cpu.is_ok()) << cpu.status().to_string();
    if (!cpu) return {};
    auto logits = cpu.value()->eval(0, t, /*all_logits=*/true);
    EXPECT_TRUE(logits.is_ok()) << logits.status().to_string();
    if (!logits) return {};
    return std::vector<float>(logits->begin(), logits->end());
  }

  std::shared_ptr<const Model> model_;
};

// Top-1 agreement of two sets of logits, n_vocab each, and the largest difference relative to the
// reference's spread.
// `clear`: the positions where the reference's top-1 leads its second by more than kClearMargin of its
// range (a random-weight model has many near-ties, which any difference in rounding may reorder).
constexpr double kClearMargin = 0.05;
struct Agreement {
  int same = 0, total = 0;
  int clear_same = 0, clear = 0;
  double max_rel = 0.0;
  bool bitwise = true;
};
Agreement agreement(std::span<const float> a, std::span<const float> b, size_t nv) {
  Agreement r;
  for (size_t i = 0; i + nv <= std::min(a.size(), b.size()); i += nv) {
    const auto x = a.subspan(i, nv), y = b.subspan(i, nv);
    const bool same = argmax(x) == argmax(y);
    r.same += same;
    ++r.total;
    const auto [lo, hi] = std::minmax_element(y.begin(), y.end());
    const double range = std::max(1e-6, static_cast<double>(*hi - *lo));
    double d = 0.0;
    for (size_t k = 0; k < nv; ++k) d = std::max(d, static_cast<double>(std::fabs(x[k] - y[k])));
    r.max_rel = std::max(r.max_rel, d / range);
    r.bitwise = r.bitwise && std::equal(x.begin(), x.end(), y.begin());
    std::vector<float> sorted(y.begin(), y.end());
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    if ((sorted[0] - sorted[1]) / range > kClearMargin) {
      ++r.clear;
      r.clear_same += same;
    }
  }
  return r;
}

// The CPU engine quantizes matmul inputs to 8 bits; the CUDA backend computes in float: logits differ by
// that quantization noise (a few percent of their range at most), which reorders near-ties only. Every
// position where the CPU's choice is clear agrees; over all positions, agreement is printed (the OpenCL
// float numerics reach 95.9% on SmolLM2 by the same measure) and held to 90%. (Float numerics; the
// default, exact numerics, equal the CPU bit for bit: ExactNumericsEqualTheCpuEngineBitForBit.) Run with the
// defaults, then with Q6_K rows on the integer GEMV too (CudaOptions::q6k_integer, off by default).
TEST_P(CudaEngineTest, TeacherForcedTop1AgreesWithTheCpuEngine) {
  const std::vector<int32_t> t = tokens(320);
  const std::vector<float> ref = cpu_logits(t);
  ASSERT_FALSE(ref.empty());
  for (const bool q6k : {false, true}) {
    SCOPED_TRACE(q6k ? "q6k_integer" : "defaults");
    CudaOptions fo;
    fo.numerics = Numerics::kFloat;
    fo.q6k_integer = q6k;
    auto r = runner(1, 512, 0, 0, fo);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    auto got = r.value()->eval(0, t, /*all_logits=*/true);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    const Agreement a = agreement(*got, ref, static_cast<size_t>(model_->config().n_vocab));
    std::printf("[cuda] %s%s: teacher-forced top-1 %d/%d (%.1f%%), where the CPU's choice is clear %d/%d, max |diff| "
                "%.4f of the logits' range\n",
                std::filesystem::path(GetParam()).filename().c_str(), q6k ? " (Q6_K integer GEMV)" : "", a.same,
                a.total, 100.0 * a.same / a.total, a.clear_same, a.clear, a.max_rel);
    EXPECT_EQ(a.clear_same, a.clear);
    EXPECT_GE(a.same * 100, a.total * 90);
  }
}

// Exact numerics: the CPU engine's arithmetic on the GPU. Teacher-forced logits of a 320-token prefill
// and of 24 tokens decoded one at a time equal the CPU engine's bit for bit.
TEST_P(CudaEngineTest, ExactNumericsEqualTheCpuEngineBitForBit) {
  const std::vector<int32_t> t = tokens(320);
  const std::vector<float> ref = cpu_logits(t);
  ASSERT_FALSE(ref.empty());
  CudaOptions o;
  o.numerics = Numerics::kExact;
  auto r = runner(1, 512, 0, 0, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  auto got = r.value()->eval(0, t, /*all_logits=*/true);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  const size_t nv = static_cast<size_t>(model_->config().n_vocab);
  size_t differ = 0;
  float max_diff = 0.0f;
  for (size_t i = 0; i < std::min(got->size(), ref.size()); ++i) {
    if (std::memcmp(&(*got)[i], &ref[i], sizeof(float)) != 0) {
      ++differ;
      max_diff = std::max(max_diff, std::fabs((*got)[i] - ref[i]));
    }
  }
  const Agreement a = agreement(*got, ref, nv);
  std::printf("[cuda] %s, exact numerics: %zu of %zu logits differ from the CPU engine's (max |diff| %g); "
              "teacher-forced top-1 %d/%d\n",
              std::filesystem::path(GetParam()).filename().c_str(), differ, ref.size(), static_cast<double>(max_diff),
              a.same, a.total);
  EXPECT_EQ(got->size(), ref.size());
  EXPECT_EQ(differ, 0u);
  // Decode: one token per step.
  auto d = runner(1, 512, 0, 0, o);
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  size_t decode_differ = 0;
  for (size_t i = 0; i < 24; ++i) {
    auto step = d.value()->eval(0, std::span<const int32_t>(&t[i], 1));
    ASSERT_TRUE(step.is_ok()) << step.status().to_string();
    ASSERT_EQ(step->size(), nv);
    decode_differ += std::memcmp(step->data(), &ref[i * nv], nv * sizeof(float)) != 0;
  }
  std::printf("[cuda] %s, exact numerics: decode steps differing from the CPU engine: %zu of 24\n",
              std::filesystem::path(GetParam()).filename().c_str(), decode_differ);
  EXPECT_EQ(decode_differ, 0u);
}

// Batch invariance: a token's logits do not depend on the other tokens of its step. Prefill equals
// token-by-token decode and two slots decoding side by side equal each other, bit for bit, with exact
// numerics and with either float matmul path.
TEST_P(CudaEngineTest, PrefillEqualsDecodeAndTwoSlotsEqualSeparateRuns) {
  const std::vector<int32_t> t = tokens(40);
  const size_t nv = static_cast<size_t>(model_->config().n_vocab);
  const CudaOptions configs[] = {CudaOptions{0, MatmulPath::kGemv, Activations::kFloat, Numerics::kExact},
                                 CudaOptions{0, MatmulPath::kGemv, Activations::kFloat, Numerics::kFloat},
                                 CudaOptions{0, MatmulPath::kTensorCores, Activations::kFloat, Numerics::kFloat}};
  for (const CudaOptions& o : configs) {
    const char* name = *o.numerics == Numerics::kExact ? "exact" : matmul_path_name(o.matmul);
    SCOPED_TRACE(name);
    auto r = runner(/*n_slots=*/3, 512, 0, 0, o);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    ModelRunner& m = *r.value();
    auto pre = m.eval(0, t, /*all_logits=*/true);
    ASSERT_TRUE(pre.is_ok()) << pre.status().to_string();
    const std::vector<float> prefill(pre->begin(), pre->end());
    std::vector<float> decode;
    for (size_t i = 0; i < t.size(); ++i) {
      auto d = m.eval(1, std::span<const int32_t>(&t[i], 1));
      ASSERT_TRUE(d.is_ok()) << d.status().to_string();
      decode.insert(decode.end(), d->begin(), d->end());
    }
    const Agreement a = agreement(decode, prefill, nv);
    std::printf("[cuda] %s: prefill vs decode: top-1 %d/%d, max |diff| %.6f of the range%s\n", name, a.same, a.total,
                a.max_rel, a.bitwise ? ", bit for bit" : "");
    EXPECT_TRUE(a.bitwise);
    // Slots 1 and 2 decode the same tokens side by side, two tokens a step.
    m.clear_slot(1);
    std::vector<float> together;
    for (size_t i = 0; i < t.size(); ++i) {
      const BatchToken batch[2] = {{t[i], 1, static_cast<int32_t>(i), true}, {t[i], 2, static_cast<int32_t>(i), true}};
      auto d = m.forward(batch);
      ASSERT_TRUE(d.is_ok()) << d.status().to_string();
      ASSERT_EQ(d->size(), 2 * nv);
      for (size_t k = 0; k < nv; ++k) ASSERT_EQ((*d)[k], (*d)[nv + k]) << "the two slots differ at token " << i;
      together.insert(together.end(), d->begin(), d->begin() + static_cast<std::ptrdiff_t>(nv));
    }
    EXPECT_TRUE(agreement(together, decode, nv).bitwise);
  }
}

// CUDA graphs: decode steps replayed from a captured graph equal the same steps launched kernel by kernel,
// bit for bit, in both numerics; the backend counts one capture per shape and a replay per step.
TEST_P(CudaEngineTest, GraphReplaysEqualDirectLaunches) {
  const std::vector<int32_t> t = tokens(24);
  for (Numerics numerics : {Numerics::kExact, Numerics::kFloat}) {
    SCOPED_TRACE(numerics_name(numerics));
    std::vector<float> out[2];
    for (int graphs = 0; graphs < 2; ++graphs) {
      CudaOptions o;
      o.numerics = numerics;
      o.graphs = graphs == 1;
      auto r = runner(1, 512, 0, 0, o);
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      auto pre = r.value()->eval(0, std::span<const int32_t>(t.data(), 8));  // 8 tokens: a graph too
      ASSERT_TRUE(pre.is_ok()) << pre.status().to_string();
      out[graphs].assign(pre->begin(), pre->end());
      for (size_t i = 8; i < t.size(); ++i) {
        auto d = r.value()->eval(0, std::span<const int32_t>(&t[i], 1));
        ASSERT_TRUE(d.is_ok()) << d.status().to_string();
        out[graphs].insert(out[graphs].end(), d->begin(), d->end());
      }
      const auto* cb = dynamic_cast<const CudaBackend*>(&r.value()->backend());
      ASSERT_NE(cb, nullptr);
      std::printf("[cuda] %s, graphs %s: %lld captured, %lld replayed\n", numerics_name(numerics), graphs ? "on" : "off",
                  static_cast<long long>(cb->stats().graph_captures), static_cast<long long>(cb->stats().graph_replays));
      if (graphs == 1) {
        EXPECT_GE(cb->stats().graph_captures, 2);  // the 8-token prefill and the 1-token decode shapes
        EXPECT_GE(cb->stats().graph_replays, static_cast<int64_t>(t.size() - 8 + 1));  // every step
      } else {
        EXPECT_EQ(cb->stats().graph_replays, 0);
      }
    }
    ASSERT_EQ(out[0].size(), out[1].size());
    EXPECT_EQ(0, std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)));
  }
}

// Fused GEMVs (CudaOptions::fuse): decode steps of one and of two slots (Q, K and V in one launch, gate
// and up with the activation in one) give the logits of the separate kernels bit for bit, float numerics
// with float and q8 inputs; the backend counts the fused launches.
TEST_P(CudaEngineTest, FusedGemvsEqualSeparateKernels) {
  const std::vector<int32_t> t = tokens(20);
  for (Activations act : {Activations::kFloat, Activations::kQ8}) {
    SCOPED_TRACE(activations_name(act));
    std::vector<float> out[2];
    for (int fuse = 0; fuse < 2; ++fuse) {
      CudaOptions o;
      o.numerics = Numerics::kFloat;
      o.activations = act;
      o.fuse = fuse == 1;
      auto r = runner(2, 512, 0, 0, o);
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      ModelRunner& m = *r.value();
      auto pre = m.eval(0, std::span<const int32_t>(t.data(), 4));  // 4 tokens: fused too
      ASSERT_TRUE(pre.is_ok()) << pre.status().to_string();
      out[fuse].assign(pre->begin(), pre->end());
      for (size_t i = 4; i < t.size(); ++i) {
        const BatchToken batch[2] = {{t[i], 0, static_cast<int32_t>(i), true},
                                     {t[t.size() - 1 - i], 1, static_cast<int32_t>(i - 4), true}};
        auto d = m.forward(batch);
        ASSERT_TRUE(d.is_ok()) << d.status().to_string();
        out[fuse].insert(out[fuse].end(), d->begin(), d->end());
      }
      const auto* cb = dynamic_cast<const CudaBackend*>(&m.backend());
      ASSERT_NE(cb, nullptr);
      std::printf("[cuda] %s inputs, fused GEMVs %s: %lld fused launches\n", activations_name(act), fuse ? "on" : "off",
                  static_cast<long long>(cb->stats().fused_launches));
      // A fused launch needs Q and K (and V), or gate and up, of one type (mixed-small mixes types in a layer).
      bool fusable = false;
      for (int32_t l = 0; l < model_->config().n_layer; ++l) {
        const LayerWeights& L = model_->layer(l);
        fusable = fusable || L.wq.type == L.wk.type || L.w_gate.type == L.w_up.type;
      }
      if (fuse == 1 && fusable) {
        EXPECT_GT(cb->stats().fused_launches, 0);
      } else {
        EXPECT_EQ(cb->stats().fused_launches, 0) << (fuse == 1 ? "a model without two matrices of one type" : "");
      }
    }
    ASSERT_EQ(out[0].size(), out[1].size());
    size_t differ = 0;
    for (size_t i = 0; i < out[0].size(); ++i) differ += std::memcmp(&out[0][i], &out[1][i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << "of " << out[0].size() << " logits";
  }
}

// KV blocks (graph.h): a sequence whose blocks lie scattered over the pool (out of order, not adjacent)
// gets the logits of the default layout (one run of blocks per slot), and a second sequence that takes
// the first two blocks of its prompt from the first (set_slot with their 128 positions) and computes only
// the rest gets the logits of computing its whole prompt from scratch, bit for bit: only addresses change.
// The passes are the same on both sides; the decode steps of both slots replay one CUDA graph while the
// block tables change between them.
TEST_P(CudaEngineTest, ScatteredAndSharedKvBlocksGiveTheSameLogits) {
  constexpr int32_t kPrefix = 128, kPrompt = 150, kTokens = 153;  // 3 blocks; the last 3 tokens decoded
  // The prefix, then tokens [kPrefix, kPrompt) of `seq` into `slot`, then the rest one by one: the logits
  // of every row from `from` (0, or kPrefix where the prefix is already there).
  auto run = [](ModelRunner& m, int32_t slot, const std::vector<int32_t>& seq, int32_t from) {
    std::vector<float> out;
    auto pass = [&](size_t first, size_t n) {
      auto r = m.eval(slot, std::span<const int32_t>(&seq[first], n), /*all_logits=*/true);
      EXPECT_TRUE(r.is_ok()) << r.status().to_string();
      if (r) out.insert(out.end(), r->begin(), r->end());
    };
    if (from == 0) pass(0, kPrefix);
    pass(kPrefix, kPrompt - kPrefix);
    for (size_t i = kPrompt; i < seq.size(); ++i) pass(i, 1);
    return out;
  };
  const std::vector<int32_t> first = tokens(kTokens);
  std::vector<int32_t> second = first;
  for (size_t i = kPrefix; i < second.size(); ++i) second[i] = first[(i * 7) % kPrefix];
  const size_t nv = static_cast<size_t>(model_->config().n_vocab);
  const CudaOptions configs[] = {CudaOptions{0, MatmulPath::kGemv, Activations::kFloat, Numerics::kExact},
                                 CudaOptions{0, MatmulPath::kGemv, Activations::kFloat, Numerics::kFloat}};
  for (const CudaOptions& o : configs) {
    SCOPED_TRACE(numerics_name(*o.numerics));
    auto ref = runner(1, 192, 0, 0, o);
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    const std::vector<float> want_first = run(*ref.value(), 0, first, 0);
    ref.value()->clear_slot(0);
    std::vector<float> want_second = run(*ref.value(), 0, second, 0);
    want_second.erase(want_second.begin(), want_second.begin() + static_cast<std::ptrdiff_t>(kPrefix * nv));

    auto pool = runner(2, 192, 0, 0, o, /*n_blocks=*/8);
    ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
    ModelRunner& m = *pool.value();
    const ModelConfig& c = model_->config();
    EXPECT_EQ(m.backend().memory().kv, size_t{8} * 2 * 64 * static_cast<size_t>(c.n_embd_kv()) * 2 *
                                           static_cast<size_t>(c.n_layer));
    const int32_t blocks0[] = {6, 1, 4}, blocks1[] = {6, 1, 3};  // slot 1 shares blocks 6 and 1
    ASSERT_TRUE(m.set_slot(0, blocks0, 0).is_ok());
    const std::vector<float> got_first = run(m, 0, first, 0);
    ASSERT_TRUE(m.set_slot(1, blocks1, kPrefix).is_ok());
    const std::vector<float> got_second = run(m, 1, second, kPrefix);
    ASSERT_EQ(got_first.size(), want_first.size());
    ASSERT_EQ(got_second.size(), want_second.size());
    const Agreement a = agreement(got_first, want_first, nv), b = agreement(got_second, want_second, nv);
    std::printf("[cuda] %s numerics, KV blocks: scattered vs the default layout%s, shared prefix vs from scratch%s\n",
                numerics_name(*o.numerics), a.bitwise ? " bit for bit" : " DIFFER",
                b.bitwise ? " bit for bit" : " DIFFER");
    EXPECT_TRUE(a.bitwise);
    EXPECT_TRUE(b.bitwise);
  }
}

TEST_P(CudaEngineTest, AStageOnTheGpuAndTheRestOnTheCpuEqualTheWholeModel) {
  const int32_t n_layer = model_->config().n_layer;
  if (n_layer < 2) GTEST_SKIP() << "one layer";
  const std::vector<int32_t> t = tokens(24);
  const size_t nv = static_cast<size_t>(model_->config().n_vocab);
  auto whole = runner();
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  ASSERT_TRUE(whole.value()->backend().exact()) << "exact numerics are the default on an x86 host";
  auto w = whole.value()->eval(0, t, /*all_logits=*/true);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  const std::vector<float> want(w->begin(), w->end());

  auto first = runner(1, 512, 0, n_layer / 2);
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  EngineOptions co;
  co.n_ctx = 512;
  co.first_layer = n_layer / 2;
  co.end_layer = n_layer;
  auto second = Engine::create(model_, co);
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  std::vector<BatchToken> batch;
  for (size_t i = 0; i < t.size(); ++i) batch.push_back({t[i], 0, static_cast<int32_t>(i), true});
  auto hidden = first.value()->forward(batch);
  ASSERT_TRUE(hidden.is_ok()) << hidden.status().to_string();
  const std::vector<float> h(hidden->begin(), hidden->end());
  auto got = second.value()->forward(batch, h);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  const Agreement a = agreement(*got, want, nv);
  std::printf("[cuda] cuda|cpu pipeline vs whole model on cuda (exact numerics): top-1 %d/%d, max |diff| %.4f of "
              "the range%s\n",
              a.same, a.total, a.max_rel, a.bitwise ? ", bit for bit" : "");
  // Exact numerics (the default): the GPU half computes as the CPU does, so the split changes nothing.
  EXPECT_TRUE(a.bitwise);
}

TEST_P(CudaEngineTest, AKvCacheTooLargeForTheDeviceIsRefusedAndNothingStaysAllocated) {
  size_t free0 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  const ModelConfig& c = model_->config();
  // Slots enough for a cache of twice the device's memory.
  constexpr int32_t kCtx = 1 << 20;
  const size_t per_slot = size_t{2} * 2 * static_cast<size_t>(c.n_layer) * static_cast<size_t>(c.n_embd_kv()) * kCtx;
  const int32_t slots = static_cast<int32_t>(std::min<size_t>(2 * total / per_slot + 1, 1024));
  auto r = runner(slots, kCtx);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kOutOfRange) << r.status().to_string();
  EXPECT_NE(r.status().message().find("MiB"), std::string::npos) << r.status().to_string();
  std::printf("[cuda] %s\n", r.status().to_string().c_str());
  size_t free1 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_LE(free0 - std::min(free0, free1), size_t{64} << 20) << "device memory leaked";
  auto ok = runner();
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  auto l = ok.value()->eval(0, tokens(4));
  EXPECT_TRUE(l.is_ok()) << l.status().to_string();
}

std::string model_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = std::filesystem::path(info.param).stem().string();
  for (char& ch : s) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return s + "_" + std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaEngineTest, ::testing::ValuesIn(model_files()), model_name);

}  // namespace
}  // namespace inferd::cuda
