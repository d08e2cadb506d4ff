// The backend-ops test of the OpenCL backend, after llama.cpp's test-backend-ops: each case runs one
// op on the device and on a CPU reference, for EVERY storage the generator emits (forced, not only the
// one the chooser would pick), on sizes that are not multiples of 4. A run passes when
//   * no output is NaN or infinite where the reference is finite,
//   * the normalized mean squared error sum((d - r)^2) / sum(r^2) is within the case's bound,
//   * the sentinels around every tensor (AllocOptions::guard_texels) are intact: no out-of-bounds write,
//   * every output texel was written (outputs start as NaN) and its padding lanes are zero.
// An op that a storage or shape cannot do returns kUnimplemented and is reported "unsupported".
// Each run prints one line "[backend-ops] op params storage type RESULT" (the table in issue 5).
//
// References: elementwise and row ops in double; rope is the CPU engine's own ops::rope_head; the
// matmul dequantizes the weights with inferd_kernels_cpu (scalar) and sums in double, so its bound
// covers float summation order only, not quantization error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "inferd/kernels/cpu.h"
#include "inferd/kernels/quantize.h"
#include "inferd/opencl/ops.h"
#include "ops.h"  // the CPU engine's row operations (private to inferd_engine; see CMakeLists.txt)
#include "test_device.h"

namespace inferd::opencl {
namespace {

constexpr float kSentinel = -98765.25f;
constexpr int32_t kGuardTexels = 64;  // 1 KiB each side: room for a kernel that overshoots by a slice row

std::vector<float> random_values(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// The device tensors of one run, all in one storage, all with guards.
class Harness {
 public:
  Harness(Runtime& rt, StorageType storage) : rt_(rt), storage_(storage) {}

  Runtime& runtime() { return rt_; }

  // kUnimplemented when this storage cannot hold the shape on this device.
  Result<Tensor*> input(const Bhwc& shape, const std::vector<float>& data) {
    auto t = allocate(shape);
    if (!t) return t.status();
    INFERD_RETURN_IF_ERROR(upload(rt_, *t.value(), data));
    return t;
  }

  Result<Tensor*> output(const Bhwc& shape) {
    auto t = allocate(shape);
    if (!t) return t.status();
    INFERD_RETURN_IF_ERROR(fill(rt_, *t.value(), NAN));  // texels a kernel forgets stay NaN
    return t;
  }

  // After the op: every tensor's guards, then `out`'s padding lanes, then its values.
  Status finish(const Tensor& out, std::vector<float>* values) {
    INFERD_RETURN_IF_ERROR(rt_.finish());
    for (const auto& t : tensors_) INFERD_RETURN_IF_ERROR(check_guards(rt_, *t, kSentinel));
    auto texels = download_texels(rt_, out);
    if (!texels) return texels.status();
    const TensorDescriptor& desc = out.desc();
    const Bhwc& s = desc.shape();
    for (int32_t b = 0; b < s.b; ++b) {
      for (int32_t y = 0; y < s.h; ++y) {
        for (int32_t x = 0; x < s.w; ++x) {
          for (int32_t c = s.c; c < desc.slices() * 4; ++c) {
            const float v = (*texels)[static_cast<size_t>(desc.linear_index(b, x, y, c / 4) * 4 + c % 4)];
            if (v != 0.0f) {
              return make_error(Code::kCorrupt, "padding lane c=%d of (b=%d, x=%d, y=%d) holds %g, not 0", c, b, x,
                                y, static_cast<double>(v));
            }
          }
        }
      }
    }
    values->resize(static_cast<size_t>(s.elements()));
    return download(rt_, out, *values);
  }

 private:
  Result<Tensor*> allocate(const Bhwc& shape) {
    const TensorDescriptor desc(shape, storage_);
    if (Status fits = desc.fits(rt_.info()); !fits) return Status(Code::kUnimplemented, fits.message());
    auto t = Tensor::allocate(rt_, desc, AllocOptions{kGuardTexels});
    if (!t) return t.status();
    tensors_.push_back(std::make_unique<Tensor>(std::move(t.value())));
    INFERD_RETURN_IF_ERROR(fill_guards(rt_, *tensors_.back(), kSentinel));
    return tensors_.back().get();
  }

  Runtime& rt_;
  StorageType storage_;
  std::vector<std::unique_ptr<Tensor>> tensors_;
};

#define ASSIGN_OR_RETURN(lhs, expr)       \
  auto lhs##_result = (expr);             \
  if (!lhs##_result) return lhs##_result.status(); \
  auto lhs = lhs##_result.value()

class OpCase {
 public:
  virtual ~OpCase() = default;
  virtual std::string op() const = 0;
  virtual std::string params() const = 0;
  virtual std::string type() const { return "f32"; }
  virtual double max_nmse() const { return 1e-7; }
  // Runs the op on the device with every tensor in h's storage; `out` receives the output.
  virtual Status run(Ops& ops, Harness& h, std::vector<float>* out) = 0;
  virtual std::vector<float> reference() const = 0;
};

// ---- Cases ---------------------------------------------------------------------------------------

enum class Binary { kAdd, kMul, kSwiglu };

class BinaryCase final : public OpCase {
 public:
  BinaryCase(Binary kind, Bhwc shape, uint32_t seed)
      : kind_(kind), shape_(shape), a_(random_values(shape.elements(), seed, -4.0f, 4.0f)),
        b_(random_values(shape.elements(), seed + 1)) {}
  std::string op() const override {
    return kind_ == Binary::kAdd ? "add" : kind_ == Binary::kMul ? "mul" : "swiglu";
  }
  std::string params() const override { return shape_.to_string(); }
  Status run(Ops& ops, Harness& h, std::vector<float>* out) override {
    ASSIGN_OR_RETURN(a, h.input(shape_, a_));
    ASSIGN_OR_RETURN(b, h.input(shape_, b_));
    ASSIGN_OR_RETURN(d, h.output(shape_));
    Status s = kind_ == Binary::kAdd ? ops.add(*a, *b, *d) : kind_ == Binary::kMul ? ops.mul(*a, *b, *d)
                                                                                    : ops.swiglu(*a, *b, *d);
    INFERD_RETURN_IF_ERROR(s);
    return h.finish(*d, out);
  }
  std::vector<float> reference() const override {
    std::vector<float> r(a_.size());
    for (size_t i = 0; i < r.size(); ++i) {
      const double a = a_[i], b = b_[i];
      r[i] = static_cast<float>(kind_ == Binary::kAdd ? a + b : kind_ == Binary::kMul ? a * b : a / (1.0 + std::exp(-a)) * b);
    }
    return r;
  }

 private:
  Binary kind_;
  Bhwc shape_;
  std::vector<float> a_, b_;
};

class RmsNormCase final : public OpCase {
 public:
  RmsNormCase(Bhwc shape, uint32_t seed)
      : shape_(shape), x_(random_values(shape.elements(), seed)), w_(random_values(shape.c, seed + 1, 0.5f, 1.5f)) {}
  std::string op() const override { return "rms_norm"; }
  std::string params() const override { return shape_.to_string(); }
  Status run(Ops& ops, Harness& h, std::vector<float>* out) override {
    ASSIGN_OR_RETURN(x, h.input(shape_, x_));
    ASSIGN_OR_RETURN(w, h.input(Bhwc{1, 1, 1, shape_.c}, w_));
    ASSIGN_OR_RETURN(d, h.output(shape_));
    INFERD_RETURN_IF_ERROR(ops.rms_norm(*x, *w, kEps, *d));
    return h.finish(*d, out);
  }
  std::vector<float> reference() const override {
    std::vector<float> r(x_.size());
    for (size_t row = 0; row < x_.size() / static_cast<size_t>(shape_.c); ++row) {
      const float* x = &x_[row * static_cast<size_t>(shape_.c)];
      double sum = 0.0;
      for (int32_t c = 0; c < shape_.c; ++c) sum += double{x[c]} * x[c];
      const double scale = 1.0 / std::sqrt(sum / shape_.c + kEps);
      for (int32_t c = 0; c < shape_.c; ++c) {
        r[row * static_cast<size_t>(shape_.c) + static_cast<size_t>(c)] = static_cast<float>(x[c] * scale * w_[static_cast<size_t>(c)]);
      }
    }
    return r;
  }

 private:
  static constexpr float kEps = 1e-5f;
  Bhwc shape_;
  std::vector<float> x_, w_;
};

class RopeCase final : public OpCase {
 public:
  RopeCase(RopeMode mode, int32_t head_dim, int32_t heads, int32_t tokens, float base, uint32_t seed)
      : mode_(mode), shape_{1, heads, tokens, head_dim}, base_(base), x_(random_values(shape_.elements(), seed)) {
    static constexpr int32_t kPositions[] = {0, 1, 7, 100, 1023, 4095};
    for (int32_t t = 0; t < tokens; ++t) pos_.push_back(kPositions[t % 6]);
  }
  std::string op() const override { return mode_ == RopeMode::kNormal ? "rope" : "rope_neox"; }
  std::string params() const override {
    return "d=" + std::to_string(shape_.c) + ",heads=" + std::to_string(shape_.h) + ",tokens=" + std::to_string(shape_.w);
  }
  // Device sin/cos of angles up to 4095 rad differ from the host's by a few ulp of the angle.
  double max_nmse() const override { return 1e-6; }
  Status run(Ops& ops, Harness& h, std::vector<float>* out) override {
    ASSIGN_OR_RETURN(x, h.input(shape_, x_));
    ASSIGN_OR_RETURN(d, h.output(shape_));
    auto pos = h.runtime().create_buffer(pos_.size() * sizeof(int32_t), CL_MEM_READ_ONLY, pos_.data());
    if (!pos) return pos.status();
    INFERD_RETURN_IF_ERROR(ops.rope(*x, pos->get(), base_, mode_, *d));
    return h.finish(*d, out);
  }
  std::vector<float> reference() const override {
    std::vector<float> r = x_;
    const RopeStyle style = mode_ == RopeMode::kNormal ? RopeStyle::kNormal : RopeStyle::kNeox;
    for (int32_t y = 0; y < shape_.h; ++y) {
      for (int32_t t = 0; t < shape_.w; ++t) {
        ops::rope_head(&r[static_cast<size_t>(shape_.offset(0, t, y, 0))], shape_.c, pos_[static_cast<size_t>(t)],
                       base_, style);
      }
    }
    return r;
  }

 private:
  RopeMode mode_;
  Bhwc shape_;
  float base_;
  std::vector<float> x_;
  std::vector<int32_t> pos_;
};

// Scores of `tokens` new tokens (x) for `heads` heads (y) over `n_kv` positions (c), causally
// masked: token t sees positions c <= n_kv - tokens + t. With per-head masks the unmasked entries
// also get a bias in [-1, 0] (ALiBi-like); `masked_row` masks token 0 entirely.
class SoftmaxCase final : public OpCase {
 public:
  SoftmaxCase(int32_t heads, int32_t tokens, int32_t n_kv, bool per_head_mask, bool masked_row, uint32_t seed)
      : shape_{1, heads, tokens, n_kv}, mask_shape_{1, per_head_mask ? heads : 1, tokens, n_kv}, masked_row_(masked_row),
        x_(random_values(shape_.elements(), seed, -8.0f, 8.0f)) {
    const std::vector<float> bias = random_values(mask_shape_.elements(), seed + 1, -1.0f, 0.0f);
    mask_.resize(bias.size());
    for (int32_t y = 0; y < mask_shape_.h; ++y) {
      for (int32_t t = 0; t < tokens; ++t) {
        for (int32_t c = 0; c < n_kv; ++c) {
          const size_t i = static_cast<size_t>(mask_shape_.offset(0, t, y, c));
          const bool visible = c <= n_kv - tokens + t && !(masked_row && t == 0);
          mask_[i] = !visible ? -INFINITY : per_head_mask ? bias[i] : 0.0f;
        }
      }
    }
  }
  std::string op() const override { return "softmax"; }
  std::string params() const override {
    return shape_.to_string() + (mask_shape_.h > 1 ? ",head_mask" : "") + (masked_row_ ? ",masked_row" : "");
  }
  Status run(Ops& ops, Harness& h, std::vector<float>* out) override {
    ASSIGN_OR_RETURN(x, h.input(shape_, x_));
    ASSIGN_OR_RETURN(m, h.input(mask_shape_, mask_));
    ASSIGN_OR_RETURN(d, h.output(shape_));
    INFERD_RETURN_IF_ERROR(ops.softmax(*x, *m, kScale, *d));
    return h.finish(*d, out);
  }
  std::vector<float> reference() const override {
    std::vector<float> r(x_.size());
    std::vector<double> v(static_cast<size_t>(shape_.c));
    for (int32_t y = 0; y < shape_.h; ++y) {
      for (int32_t t = 0; t < shape_.w; ++t) {
        double max = -INFINITY;
        for (int32_t c = 0; c < shape_.c; ++c) {
          const float m = mask_[static_cast<size_t>(mask_shape_.offset(0, t, mask_shape_.h == 1 ? 0 : y, c))];
          v[static_cast<size_t>(c)] = double{x_[static_cast<size_t>(shape_.offset(0, t, y, c))]} * kScale + m;
          max = std::max(max, v[static_cast<size_t>(c)]);
        }
        double sum = 0.0;
        for (double& e : v) sum += (e = max == -INFINITY ? 0.0 : std::exp(e - max));
        for (int32_t c = 0; c < shape_.c; ++c) {
          r[static_cast<size_t>(shape_.offset(0, t, y, c))] =
              sum > 0.0 ? static_cast<float>(v[static_cast<size_t>(c)] / sum) : 0.0f;
        }
      }
    }
    return r;
  }

 private:
  static constexpr float kScale = 0.125f;
  Bhwc shape_, mask_shape_;
  bool masked_row_;
  std::vector<float> x_, mask_;
};

class MatmulCase final : public OpCase {
 public:
  MatmulCase(DType type, int64_t rows, int64_t k, int32_t tokens, MatmulVariant variant, uint32_t seed)
      : type_(type), rows_(rows), k_(k), tokens_(tokens), variant_(variant),
        x_(random_values(int64_t{tokens} * k, seed + 1)) {
    const std::vector<float> w = random_values(rows * k, seed);
    const size_t row_bytes = dtype_row_bytes(type, k);
    weights_.resize(static_cast<size_t>(rows) * row_bytes);
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = &w[static_cast<size_t>(r * k)];
      void* dst = &weights_[static_cast<size_t>(r) * row_bytes];
      if (type == DType::kF32) {
        std::memcpy(dst, src, row_bytes);
      } else if (type == DType::kF16) {
        kernels::fp32_to_fp16_row(src, static_cast<fp16_t*>(dst), k);
      } else {
        kernels::quantize_row_ref(type, src, dst, k);
      }
    }
    // The reference multiplies by exactly the values the device sees: the dequantized weights.
    dequantized_.resize(static_cast<size_t>(rows * k));
    const kernels::TypeKernels* tk = kernels::type_kernels(type, kernels::Isa::kScalar);
    INFERD_ASSERT(tk != nullptr);
    for (int64_t r = 0; r < rows; ++r) {
      tk->to_float(&weights_[static_cast<size_t>(r) * row_bytes], &dequantized_[static_cast<size_t>(r * k)], k);
    }
  }
  std::string op() const override { return std::string("matmul_") + matmul_variant_name(variant_); }
  std::string params() const override {
    return "rows=" + std::to_string(rows_) + ",k=" + std::to_string(k_) + ",tokens=" + std::to_string(tokens_);
  }
  std::string type() const override { return dtype_name(type_); }
  double max_nmse() const override { return 1e-6; }
  Status run(Ops& ops, Harness& h, std::vector<float>* out) override {
    auto w = MatmulWeights::upload(h.runtime(), type_, rows_, k_, weights_.data());
    if (!w) return w.status();
    ASSIGN_OR_RETURN(x, h.input(Bhwc{1, 1, tokens_, static_cast<int32_t>(k_)}, x_));
    ASSIGN_OR_RETURN(y, h.output(Bhwc{1, 1, tokens_, static_cast<int32_t>(rows_)}));
    INFERD_RETURN_IF_ERROR(ops.matmul(w.value(), *x, *y, variant_));
    return h.finish(*y, out);
  }
  std::vector<float> reference() const override {
    std::vector<float> y(static_cast<size_t>(tokens_ * rows_));
    for (int32_t t = 0; t < tokens_; ++t) {
      for (int64_t r = 0; r < rows_; ++r) {
        double sum = 0.0;
        for (int64_t i = 0; i < k_; ++i) {
          sum += double{dequantized_[static_cast<size_t>(r * k_ + i)]} * x_[static_cast<size_t>(t * k_ + i)];
        }
        y[static_cast<size_t>(t * rows_ + r)] = static_cast<float>(sum);
      }
    }
    return y;
  }

 private:
  DType type_;
  int64_t rows_, k_;
  int32_t tokens_;
  MatmulVariant variant_;
  std::vector<float> x_, dequantized_;
  std::vector<unsigned char> weights_;
};

// ---- The driver ----------------------------------------------------------------------------------

using Cases = std::vector<std::unique_ptr<OpCase>>;

void run_cases(Runtime& rt, const Cases& cases) {
  Ops ops(rt);
  int passed = 0, unsupported = 0;
  for (const auto& c : cases) {
    for (StorageType storage : kAllStorageTypes) {
      const std::string what = c->op() + " " + c->params() + " " + storage_name(storage) + " " + c->type();
      Harness h(rt, storage);
      std::vector<float> got;
      const Status s = c->run(ops, h, &got);
      std::string verdict;
      if (s.code() == Code::kUnimplemented) {
        verdict = "UNSUPPORTED (" + s.message() + ")";
        ++unsupported;
      } else if (!s) {
        verdict = "FAIL " + s.to_string();
        ADD_FAILURE() << what << ": " << s.to_string();
      } else {
        const std::vector<float> ref = c->reference();
        double err = 0.0, norm = 0.0;
        std::string bad;
        if (got.size() != ref.size()) bad = "output size " + std::to_string(got.size());
        for (size_t i = 0; bad.empty() && i < ref.size(); ++i) {
          if (!std::isfinite(got[i]) && std::isfinite(ref[i])) {
            bad = "output " + std::to_string(i) + " is " + std::to_string(got[i]) + ", reference " + std::to_string(ref[i]);
          }
          const double d = double{got[i]} - ref[i];
          err += d * d;
          norm += double{ref[i]} * ref[i];
        }
        const double nmse = norm > 0.0 ? err / norm : err;
        char buf[64];
        std::snprintf(buf, sizeof(buf), "nmse=%.2e", nmse);
        if (bad.empty() && !(nmse <= c->max_nmse())) bad = std::string(buf) + " > " + std::to_string(c->max_nmse());
        if (bad.empty()) {
          verdict = std::string("OK ") + buf;
          ++passed;
        } else {
          verdict = "FAIL " + bad;
          ADD_FAILURE() << what << ": " << bad;
        }
      }
      std::printf("[backend-ops] %-14s %-28s %-12s %-5s %s\n", c->op().c_str(), c->params().c_str(),
                  storage_name(storage), c->type().c_str(), verdict.c_str());
    }
  }
  std::printf("[backend-ops] %d passed, %d unsupported, %zu kernels built on %s\n", passed, unsupported,
              ops.kernel_count(), rt.info().name.c_str());
}

const Bhwc kElementwiseShapes[] = {{1, 1, 1, 1}, {1, 1, 7, 3}, {1, 2, 5, 5}, {2, 3, 4, 67}, {1, 1, 2, 576}};

Cases binary_cases(Binary kind) {
  Cases cases;
  uint32_t seed = 100;
  for (const Bhwc& s : kElementwiseShapes) cases.push_back(std::make_unique<BinaryCase>(kind, s, seed++));
  return cases;
}

TEST(BackendOps, Add) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  run_cases(*rt, binary_cases(Binary::kAdd));
}

TEST(BackendOps, Mul) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  run_cases(*rt, binary_cases(Binary::kMul));
}

TEST(BackendOps, Swiglu) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  run_cases(*rt, binary_cases(Binary::kSwiglu));
}

TEST(BackendOps, RmsNorm) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  Cases cases;
  const Bhwc shapes[] = {{1, 1, 1, 1}, {1, 1, 3, 5}, {1, 2, 7, 67}, {1, 1, 4, 576}, {2, 1, 3, 3}};
  uint32_t seed = 200;
  for (const Bhwc& s : shapes) cases.push_back(std::make_unique<RmsNormCase>(s, seed++));
  run_cases(*rt, cases);
}

TEST(BackendOps, Rope) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  Cases cases;
  cases.push_back(std::make_unique<RopeCase>(RopeMode::kNormal, 2, 1, 1, 10000.0f, 300));
  cases.push_back(std::make_unique<RopeCase>(RopeMode::kNormal, 6, 3, 5, 10000.0f, 301));
  cases.push_back(std::make_unique<RopeCase>(RopeMode::kNormal, 64, 2, 5, 10000.0f, 302));
  cases.push_back(std::make_unique<RopeCase>(RopeMode::kNormal, 128, 2, 6, 500000.0f, 303));
  cases.push_back(std::make_unique<RopeCase>(RopeMode::kNeox, 8, 2, 5, 10000.0f, 304));
  cases.push_back(std::make_unique<RopeCase>(RopeMode::kNeox, 64, 3, 5, 1000000.0f, 305));
  cases.push_back(std::make_unique<RopeCase>(RopeMode::kNeox, 128, 2, 6, 10000.0f, 306));
  cases.push_back(std::make_unique<RopeCase>(RopeMode::kNeox, 6, 1, 2, 10000.0f, 307));  // unsupported
  run_cases(*rt, cases);
}

TEST(BackendOps, Softmax) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  Cases cases;
  cases.push_back(std::make_unique<SoftmaxCase>(1, 1, 1, false, false, 400));
  cases.push_back(std::make_unique<SoftmaxCase>(2, 3, 5, false, false, 401));
  cases.push_back(std::make_unique<SoftmaxCase>(4, 7, 67, true, false, 402));
  cases.push_back(std::make_unique<SoftmaxCase>(2, 2, 576, false, false, 403));
  cases.push_back(std::make_unique<SoftmaxCase>(2, 3, 5, true, true, 404));
  run_cases(*rt, cases);
}

// Decode with 1 and 3 tokens, prefill with 5 (a partial tile of 4) and 8; rows and k not multiples
// of 4 where the type allows (block types need k % 32 == 0).
Cases matmul_cases(DType type) {
  struct Dims {
    int64_t rows, k;
  };
  const bool blocks = type != DType::kF32 && type != DType::kF16;
  const std::vector<Dims> dims = blocks ? std::vector<Dims>{{1, 32}, {3, 96}, {67, 576}, {576, 64}}
                                        : std::vector<Dims>{{1, 1}, {3, 67}, {67, 576}, {576, 5}};
  const std::pair<int32_t, MatmulVariant> runs[] = {{1, MatmulVariant::kDecode},
                                                    {3, MatmulVariant::kDecode},
                                                    {5, MatmulVariant::kPrefill},
                                                    {8, MatmulVariant::kPrefill}};
  Cases cases;
  uint32_t seed = 500;
  for (const Dims& d : dims) {
    for (const auto& [tokens, variant] : runs) {
      cases.push_back(std::make_unique<MatmulCase>(type, d.rows, d.k, tokens, variant, seed++));
    }
  }
  return cases;
}

TEST(BackendOps, MatmulF32) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  run_cases(*rt, matmul_cases(DType::kF32));
}

TEST(BackendOps, MatmulF16) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  run_cases(*rt, matmul_cases(DType::kF16));
}

TEST(BackendOps, MatmulQ8_0) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  run_cases(*rt, matmul_cases(DType::kQ8_0));
}

TEST(BackendOps, MatmulQ4_0) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  run_cases(*rt, matmul_cases(DType::kQ4_0));
}

TEST(BackendOps, MatmulQ4_1) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  run_cases(*rt, matmul_cases(DType::kQ4_1));
}

// Each tensor's storage is independent: one kernel reads a buffer and a texture and writes an image
// buffer. A second call reuses the kernel.
TEST(BackendOps, MixedStoragesInOneKernel) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  const Bhwc shape{1, 2, 3, 7};
  const TensorDescriptor da(shape, StorageType::kBuffer), db(shape, StorageType::kTexture2D),
      dd(shape, StorageType::kImageBuffer);
  if (!db.fits(rt->info()) || !dd.fits(rt->info())) GTEST_SKIP() << "the device has no images";
  auto a = Tensor::allocate(*rt, da);
  auto b = Tensor::allocate(*rt, db);
  auto d = Tensor::allocate(*rt, dd);
  ASSERT_TRUE(a.is_ok() && b.is_ok() && d.is_ok());
  const std::vector<float> va = random_values(shape.elements(), 1), vb = random_values(shape.elements(), 2);
  ASSERT_TRUE(upload(*rt, a.value(), va).is_ok());
  ASSERT_TRUE(upload(*rt, b.value(), vb).is_ok());
  Ops ops(*rt);
  ASSERT_TRUE(ops.add(a.value(), b.value(), d.value()).is_ok());
  ASSERT_TRUE(ops.add(a.value(), b.value(), d.value()).is_ok());
  EXPECT_EQ(ops.kernel_count(), 1u);
  std::vector<float> got(va.size());
  ASSERT_TRUE(download(*rt, d.value(), got).is_ok());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], va[i] + vb[i]) << i;
}

// Bad shapes and types are error values, never crashes.
TEST(BackendOps, RejectsBadArguments) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  Ops ops(*rt);
  auto make = [&](Bhwc s) { return std::move(Tensor::allocate(*rt, TensorDescriptor(s, StorageType::kBuffer)).value()); };
  Tensor a = make({1, 1, 3, 5}), b = make({1, 1, 3, 6}), w = make({1, 1, 1, 6}), d = make({1, 1, 3, 5});
  EXPECT_EQ(ops.add(a, b, d).code(), Code::kInvalidArgument);
  EXPECT_EQ(ops.rms_norm(a, w, 1e-5f, d).code(), Code::kInvalidArgument);
  EXPECT_EQ(ops.softmax(a, b, 1.0f, d).code(), Code::kInvalidArgument);

  auto pos = rt->create_buffer(sizeof(int32_t));
  ASSERT_TRUE(pos.is_ok());
  Tensor r = make({1, 2, 3, 8}), rd = make({1, 2, 3, 8});
  EXPECT_EQ(ops.rope(r, pos->get(), 10000.0f, RopeMode::kNormal, rd).code(), Code::kInvalidArgument);  // 1 position

  const std::vector<unsigned char> bytes(4096, 0);
  EXPECT_EQ(MatmulWeights::upload(*rt, DType::kQ8_0, 2, 33, bytes.data()).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(MatmulWeights::upload(*rt, DType::kQ6_K, 2, 256, bytes.data()).status().code(), Code::kUnimplemented);
  EXPECT_EQ(MatmulWeights::upload(*rt, DType::kF32, 0, 4, bytes.data()).status().code(), Code::kInvalidArgument);
  auto mw = MatmulWeights::upload(*rt, DType::kF32, 4, 6, bytes.data());
  ASSERT_TRUE(mw.is_ok());
  EXPECT_EQ(ops.matmul(mw.value(), a, d).code(), Code::kInvalidArgument);  // k = 5, not 6
}

TEST(BackendOps, StageChoosesTheMatmulKernel) {
  EXPECT_EQ(choose_matmul_variant(1), MatmulVariant::kDecode);
  EXPECT_EQ(choose_matmul_variant(3), MatmulVariant::kDecode);
  EXPECT_EQ(choose_matmul_variant(4), MatmulVariant::kPrefill);
  EXPECT_EQ(choose_matmul_variant(512), MatmulVariant::kPrefill);
}

}  // namespace
}  // namespace inferd::opencl
