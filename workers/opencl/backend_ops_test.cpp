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

// Random weights of `type` in ggml's row layout, and their exact float values.
struct RandomWeights {
  std::vector<unsigned char> bytes;
  std::vector<float> values;
};

RandomWeights random_weights(DType type, int64_t rows, int64_t k, uint32_t seed) {
  const std::vector<float> w = random_values(rows * k, seed);
  const size_t row_bytes = dtype_row_bytes(type, k);
  RandomWeights out;
  out.bytes.resize(static_cast<size_t>(rows) * row_bytes);
  out.values.resize(static_cast<size_t>(rows * k));
  const kernels::TypeKernels* tk = kernels::type_kernels(type, kernels::Isa::kScalar);
  INFERD_ASSERT(tk != nullptr);
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = &w[static_cast<size_t>(r * k)];
    void* dst = &out.bytes[static_cast<size_t>(r) * row_bytes];
    if (type == DType::kF32) {
      std::memcpy(dst, src, row_bytes);
    } else if (type == DType::kF16) {
      kernels::fp32_to_fp16_row(src, static_cast<fp16_t*>(dst), k);
    } else {
      kernels::quantize_row_ref(type, src, dst, k);
    }
    tk->to_float(dst, &out.values[static_cast<size_t>(r * k)], k);
  }
  return out;
}

// The embedding lookup reads the matmul layout: every row of every type comes back exactly.
class GetRowsCase final : public OpCase {
 public:
  GetRowsCase(DType type, int64_t rows, int64_t k, std::vector<int32_t> ids, uint32_t seed)
      : type_(type), rows_(rows), k_(k), ids_(std::move(ids)), w_(random_weights(type, rows, k, seed)) {}
  std::string op() const override { return "get_rows"; }
  std::string params() const override {
    return "rows=" + std::to_string(rows_) + ",k=" + std::to_string(k_) + ",ids=" + std::to_string(ids_.size());
  }
  std::string type() const override { return dtype_name(type_); }
  double max_nmse() const override { return 1e-12; }  // q * d + m may be one fused multiply-add or two
  Status run(Ops& ops, Harness& h, std::vector<float>* out) override {
    auto w = MatmulWeights::upload(h.runtime(), type_, rows_, k_, w_.bytes.data());
    if (!w) return w.status();
    auto ids = h.runtime().create_buffer(ids_.size() * sizeof(int32_t), CL_MEM_READ_ONLY, ids_.data());
    if (!ids) return ids.status();
    ASSIGN_OR_RETURN(d, h.output(Bhwc{1, 1, static_cast<int32_t>(ids_.size()), static_cast<int32_t>(k_)}));
    INFERD_RETURN_IF_ERROR(ops.get_rows(w.value(), ids->get(), *d));
    return h.finish(*d, out);
  }
  std::vector<float> reference() const override {
    std::vector<float> r;
    for (int32_t id : ids_) {
      r.insert(r.end(), w_.values.begin() + id * k_, w_.values.begin() + (id + 1) * k_);
    }
    return r;
  }

 private:
  DType type_;
  int64_t rows_, k_;
  std::vector<int32_t> ids_;
  RandomWeights w_;
};

class GatherCase final : public OpCase {
 public:
  GatherCase(int32_t tokens, int32_t channels, std::vector<int32_t> rows, uint32_t seed)
      : shape_{1, 1, tokens, channels}, rows_(std::move(rows)), x_(random_values(shape_.elements(), seed)) {}
  std::string op() const override { return "gather"; }
  std::string params() const override { return shape_.to_string() + ",rows=" + std::to_string(rows_.size()); }
  double max_nmse() const override { return 0.0; }
  Status run(Ops& ops, Harness& h, std::vector<float>* out) override {
    ASSIGN_OR_RETURN(x, h.input(shape_, x_));
    auto rows = h.runtime().create_buffer(rows_.size() * sizeof(int32_t), CL_MEM_READ_ONLY, rows_.data());
    if (!rows) return rows.status();
    ASSIGN_OR_RETURN(d, h.output(Bhwc{1, 1, static_cast<int32_t>(rows_.size()), shape_.c}));
    INFERD_RETURN_IF_ERROR(ops.gather(*x, rows->get(), *d));
    return h.finish(*d, out);
  }
  std::vector<float> reference() const override {
    std::vector<float> r;
    for (int32_t t : rows_) r.insert(r.end(), x_.begin() + t * shape_.c, x_.begin() + (t + 1) * shape_.c);
    return r;
  }

 private:
  Bhwc shape_;
  std::vector<int32_t> rows_;
  std::vector<float> x_;
};

class SwigluHalvesCase final : public OpCase {
 public:
  SwigluHalvesCase(int32_t tokens, int32_t channels, uint32_t seed)
      : tokens_(tokens), channels_(channels), x_(random_values(int64_t{tokens} * 2 * channels, seed, -4.0f, 4.0f)) {}
  std::string op() const override { return "swiglu_halves"; }
  std::string params() const override { return "tokens=" + std::to_string(tokens_) + ",c=" + std::to_string(channels_); }
  Status run(Ops& ops, Harness& h, std::vector<float>* out) override {
    ASSIGN_OR_RETURN(x, h.input(Bhwc{1, 1, tokens_, 2 * channels_}, x_));
    ASSIGN_OR_RETURN(d, h.output(Bhwc{1, 1, tokens_, channels_}));
    INFERD_RETURN_IF_ERROR(ops.swiglu_halves(*x, *d));
    return h.finish(*d, out);
  }
  std::vector<float> reference() const override {
    std::vector<float> r;
    for (int32_t t = 0; t < tokens_; ++t) {
      for (int32_t c = 0; c < channels_; ++c) {
        const double g = x_[static_cast<size_t>(t * 2 * channels_ + c)];
        const double u = x_[static_cast<size_t>(t * 2 * channels_ + channels_ + c)];
        r.push_back(static_cast<float>(g / (1.0 + std::exp(-g)) * u));
      }
    }
    return r;
  }

 private:
  int32_t tokens_, channels_;
  std::vector<float> x_;
};

// quantize_q8 then matmul (with Q4_1's block-sum corrections) against the CPU kernels' own integer
// dot products of activations they quantized themselves: equal up to float summation order.
class MatmulQ8Case final : public OpCase {
 public:
  MatmulQ8Case(DType type, int64_t rows, int64_t k, int32_t tokens, MatmulVariant variant, uint32_t seed)
      : type_(type), rows_(rows), k_(k), tokens_(tokens), variant_(variant), w_(random_weights(type, rows, k, seed)),
        x_(random_values(int64_t{tokens} * k, seed + 1, -3.0f, 3.0f)) {}
  std::string op() const override { return std::string("matmul_q8_") + matmul_variant_name(variant_); }
  std::string params() const override {
    return "rows=" + std::to_string(rows_) + ",k=" + std::to_string(k_) + ",tokens=" + std::to_string(tokens_);
  }
  std::string type() const override { return dtype_name(type_); }
  double max_nmse() const override { return 1e-10; }
  Status run(Ops& ops, Harness& h, std::vector<float>* out) override {
    auto w = MatmulWeights::upload(h.runtime(), type_, rows_, k_, w_.bytes.data());
    if (!w) return w.status();
    const Bhwc xs{1, 1, tokens_, static_cast<int32_t>(k_)};
    ASSIGN_OR_RETURN(x, h.input(xs, x_));
    ASSIGN_OR_RETURN(xq, h.output(xs));
    auto sums = h.runtime().create_buffer(static_cast<size_t>(tokens_ * k_ / 32) * sizeof(float));
    if (!sums) return sums.status();
    ASSIGN_OR_RETURN(y, h.output(Bhwc{1, 1, tokens_, static_cast<int32_t>(rows_)}));
    INFERD_RETURN_IF_ERROR(ops.quantize_q8(*x, *xq, sums->get()));
    INFERD_RETURN_IF_ERROR(ops.matmul(w.value(), *xq, *y, variant_, sums->get()));
    return h.finish(*y, out);
  }
  std::vector<float> reference() const override {
    const kernels::TypeKernels* tk = kernels::type_kernels(type_, kernels::Isa::kScalar);
    const size_t act_bytes = dtype_row_bytes(tk->act_type, k_);
    std::vector<unsigned char> act(act_bytes);
    std::vector<float> y(static_cast<size_t>(tokens_ * rows_));
    const size_t row_bytes = dtype_row_bytes(type_, k_);
    for (int32_t t = 0; t < tokens_; ++t) {
      tk->quantize_act(&x_[static_cast<size_t>(t * k_)], act.data(), k_);
      for (int64_t r = 0; r < rows_; ++r) {
        tk->dot(k_, &w_.bytes[static_cast<size_t>(r) * row_bytes], act.data(), act_bytes, 1,
                &y[static_cast<size_t>(t * rows_ + r)]);
      }
    }
    return y;
  }

 private:
  DType type_;
  int64_t rows_, k_;
  int32_t tokens_;
  MatmulVariant variant_;
  RandomWeights w_;
  std::vector<float> x_;
};

// rope_kv and attention together, against the CPU engine's rope_head and a double-precision
// attention over the same half-rounded Q, K and V. A first pass writes `history` positions of slot
// 1; the tested pass has `tokens` more tokens of slot 1 and the first token of slot 0, so the output
// covers the cache written by an earlier pass, slot indexing, GQA, the causal mask within a pass and
// the KV length padded to a multiple of 64. Q|K|V come from one fused tensor or from three.
class AttentionCase final : public OpCase {
 public:
  AttentionCase(RopeMode mode, int32_t head_dim, int32_t history, int32_t tokens, bool fused, bool bias, uint32_t seed)
      : fused_(fused), history_(history), tokens_(tokens), bias_(bias) {
    g_.n_head = 4;
    g_.n_head_kv = 2;
    g_.head_dim = head_dim;
    g_.n_slots = 2;
    g_.n_ctx = history + tokens + 3;
    g_.rope_base = 10000.0f;
    g_.rope_mode = mode;
    const int32_t qkv = g_.n_embd() + 2 * g_.n_embd_kv();
    for (int32_t t = 0; t < history; ++t) hist_.push_back({1, t});
    for (int32_t t = 0; t < tokens; ++t) pass_.push_back({1, history + t});
    pass_.push_back({0, 0});
    hist_x_ = random_values(int64_t{history} * qkv, seed, -2.0f, 2.0f);
    pass_x_ = random_values(static_cast<int64_t>(pass_.size()) * qkv, seed + 1, -2.0f, 2.0f);
    if (bias) bias_values_ = random_values(qkv, seed + 2, -0.5f, 0.5f);
  }
  std::string op() const override { return "rope_kv+attention"; }
  std::string params() const override {
    return std::string(g_.rope_mode == RopeMode::kNeox ? "neox" : "normal") + ",d=" + std::to_string(g_.head_dim) +
           ",kv=" + std::to_string(history_) + "+" + std::to_string(tokens_) + (fused_ ? ",fused" : "") +
           (bias_ ? ",bias" : "");
  }
  double max_nmse() const override { return 1e-6; }

  Status run(Ops& ops, Harness& h, std::vector<float>* out) override {
    Runtime& rt = h.runtime();
    auto cache = rt.create_buffer(g_.layer_cache_bytes());
    if (!cache) return cache.status();
    auto q_half = rt.create_buffer(std::max(hist_.size(), pass_.size()) * static_cast<size_t>(g_.n_embd()) * 2);
    if (!q_half) return q_half.status();
    ClMem bias;
    if (bias_) {
      auto b = rt.create_buffer(bias_values_.size() * sizeof(float), CL_MEM_READ_ONLY, bias_values_.data());
      if (!b) return b.status();
      bias = std::move(b).value();
    }
    const std::vector<float>* xs[2] = {&hist_x_, &pass_x_};
    const std::vector<Token>* passes[2] = {&hist_, &pass_};
    Tensor* last_out = nullptr;
    for (int p = 0; p < 2; ++p) {
      const std::vector<Token>& toks = *passes[p];
      const int32_t n = static_cast<int32_t>(toks.size());
      std::vector<int32_t> pos, slots;
      int32_t max_len = 0;
      for (const Token& t : toks) {
        pos.push_back(t.pos);
        slots.push_back(t.slot);
        max_len = std::max(max_len, t.pos + 1);
      }
      auto pos_buf = rt.create_buffer(pos.size() * sizeof(int32_t), CL_MEM_READ_ONLY, pos.data());
      auto slot_buf = rt.create_buffer(slots.size() * sizeof(int32_t), CL_MEM_READ_ONLY, slots.data());
      if (!pos_buf || !slot_buf) return !pos_buf ? pos_buf.status() : slot_buf.status();
      const TokenPlacement placement{pos_buf->get(), slot_buf->get()};
      TensorSlice q, k, v;
      const int32_t e = g_.n_embd(), ekv = g_.n_embd_kv();
      if (fused_) {
        ASSIGN_OR_RETURN(qkv, h.input(Bhwc{1, 1, n, e + 2 * ekv}, *xs[p]));
        q = {qkv, 0};
        k = {qkv, e / 4};
        v = {qkv, (e + ekv) / 4};
      } else {
        std::vector<float> parts[3];
        for (int32_t t = 0; t < n; ++t) {
          const float* row = &(*xs[p])[static_cast<size_t>(t * (e + 2 * ekv))];
          parts[0].insert(parts[0].end(), row, row + e);
          parts[1].insert(parts[1].end(), row + e, row + e + ekv);
          parts[2].insert(parts[2].end(), row + e + ekv, row + e + 2 * ekv);
        }
        ASSIGN_OR_RETURN(tq, h.input(Bhwc{1, 1, n, e}, parts[0]));
        ASSIGN_OR_RETURN(tk, h.input(Bhwc{1, 1, n, ekv}, parts[1]));
        ASSIGN_OR_RETURN(tv, h.input(Bhwc{1, 1, n, ekv}, parts[2]));
        q = {tq, 0};
        k = {tk, 0};
        v = {tv, 0};
      }
      INFERD_RETURN_IF_ERROR(ops.rope_kv(g_, q, k, v, bias.get(), placement, q_half->get(), cache->get()));
      ASSIGN_OR_RETURN(o, h.output(Bhwc{1, 1, n, e}));
      const int32_t kv_pad = (max_len + 63) / 64 * 64;
      INFERD_RETURN_IF_ERROR(ops.attention(g_, q_half->get(), placement, kv_pad,
                                           1.0f / std::sqrt(static_cast<float>(g_.head_dim)), cache->get(), *o));
      INFERD_RETURN_IF_ERROR(rt.finish());  // the per-pass buffers die at the end of this iteration
      last_out = o;
    }
    return h.finish(*last_out, out);
  }

  std::vector<float> reference() const override {
    const int32_t e = g_.n_embd(), ekv = g_.n_embd_kv(), hd = g_.head_dim, qkv = e + 2 * ekv;
    const RopeStyle style = g_.rope_mode == RopeMode::kNeox ? RopeStyle::kNeox : RopeStyle::kNormal;
    // cache[slot][pos] = (K row, V row) of ekv floats each, half-rounded.
    std::vector<std::vector<std::vector<float>>> kc(2, std::vector<std::vector<float>>(static_cast<size_t>(g_.n_ctx))),
        vc = kc;
    std::vector<float> out;
    const std::vector<float>* xs[2] = {&hist_x_, &pass_x_};
    const std::vector<Token>* passes[2] = {&hist_, &pass_};
    for (int p = 0; p < 2; ++p) {
      const std::vector<Token>& toks = *passes[p];
      std::vector<std::vector<float>> qs;
      for (size_t t = 0; t < toks.size(); ++t) {
        std::vector<float> row(xs[p]->begin() + static_cast<std::ptrdiff_t>(t * qkv),
                               xs[p]->begin() + static_cast<std::ptrdiff_t>((t + 1) * qkv));
        if (bias_) {
          for (int32_t i = 0; i < qkv; ++i) row[static_cast<size_t>(i)] += bias_values_[static_cast<size_t>(i)];
        }
        for (int32_t hh = 0; hh < g_.n_head; ++hh) ops::rope_head(&row[static_cast<size_t>(hh * hd)], hd, toks[t].pos, g_.rope_base, style);
        for (int32_t hh = 0; hh < g_.n_head_kv; ++hh) ops::rope_head(&row[static_cast<size_t>(e + hh * hd)], hd, toks[t].pos, g_.rope_base, style);
        for (float& f : row) f = ops::round_fp16(f);
        qs.emplace_back(row.begin(), row.begin() + e);
        kc[static_cast<size_t>(toks[t].slot)][static_cast<size_t>(toks[t].pos)].assign(row.begin() + e, row.begin() + e + ekv);
        vc[static_cast<size_t>(toks[t].slot)][static_cast<size_t>(toks[t].pos)].assign(row.begin() + e + ekv, row.end());
      }
      if (p == 0) continue;
      for (size_t t = 0; t < toks.size(); ++t) {
        const auto& ks = kc[static_cast<size_t>(toks[t].slot)];
        const auto& vs = vc[static_cast<size_t>(toks[t].slot)];
        for (int32_t hh = 0; hh < g_.n_head; ++hh) {
          const int32_t kvh = hh / (g_.n_head / g_.n_head_kv);
          std::vector<double> s(static_cast<size_t>(toks[t].pos + 1));
          double mx = -INFINITY;
          for (int32_t j = 0; j <= toks[t].pos; ++j) {
            double d = 0.0;
            for (int32_t i = 0; i < hd; ++i) d += double{qs[t][static_cast<size_t>(hh * hd + i)]} * ks[static_cast<size_t>(j)][static_cast<size_t>(kvh * hd + i)];
            s[static_cast<size_t>(j)] = d / std::sqrt(static_cast<double>(hd));
            mx = std::max(mx, s[static_cast<size_t>(j)]);
          }
          double sum = 0.0;
          for (double& x : s) sum += (x = std::exp(x - mx));
          for (int32_t i = 0; i < hd; ++i) {
            double acc = 0.0;
            for (int32_t j = 0; j <= toks[t].pos; ++j) acc += s[static_cast<size_t>(j)] * vs[static_cast<size_t>(j)][static_cast<size_t>(kvh * hd + i)];
            out.push_back(static_cast<float>(acc / sum));
          }
        }
      }
    }
    return out;
  }

 private:
  struct Token {
    int32_t slot, pos;
  };
  AttentionGeometry g_;
  bool fused_;
  int32_t history_, tokens_;
  bool bias_;
  std::vector<Token> hist_, pass_;
  std::vector<float> hist_x_, pass_x_, bias_values_;
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

TEST(BackendOps, GetRows) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  Cases cases;
  uint32_t seed = 600;
  for (DType type : {DType::kF32, DType::kF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    const bool blocks = type != DType::kF32 && type != DType::kF16;
    cases.push_back(std::make_unique<GetRowsCase>(type, 7, blocks ? 64 : 5, std::vector<int32_t>{6, 0, 3, 3, 5}, seed++));
    cases.push_back(std::make_unique<GetRowsCase>(type, 13, blocks ? 96 : 67, std::vector<int32_t>{12}, seed++));
  }
  run_cases(*rt, cases);
}

TEST(BackendOps, GatherAndSwigluHalves) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  Cases cases;
  cases.push_back(std::make_unique<GatherCase>(7, 67, std::vector<int32_t>{6, 0, 3}, 700));
  cases.push_back(std::make_unique<GatherCase>(1, 5, std::vector<int32_t>{0}, 701));
  cases.push_back(std::make_unique<SwigluHalvesCase>(1, 4, 702));
  cases.push_back(std::make_unique<SwigluHalvesCase>(5, 68, 703));
  run_cases(*rt, cases);
}

TEST(BackendOps, MatmulQ8Activations) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  Cases cases;
  uint32_t seed = 800;
  for (DType type : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    cases.push_back(std::make_unique<MatmulQ8Case>(type, 67, 96, 1, MatmulVariant::kDecode, seed++));
    cases.push_back(std::make_unique<MatmulQ8Case>(type, 67, 576, 3, MatmulVariant::kDecode, seed++));
    cases.push_back(std::make_unique<MatmulQ8Case>(type, 64, 576, 6, MatmulVariant::kPrefill, seed++));
  }
  run_cases(*rt, cases);
}

TEST(BackendOps, RopeKvAndAttention) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  Cases cases;
  cases.push_back(std::make_unique<AttentionCase>(RopeMode::kNormal, 8, 3, 2, /*fused=*/true, /*bias=*/false, 900));
  cases.push_back(std::make_unique<AttentionCase>(RopeMode::kNormal, 64, 70, 5, /*fused=*/false, /*bias=*/false, 901));
  cases.push_back(std::make_unique<AttentionCase>(RopeMode::kNeox, 8, 1, 4, /*fused=*/false, /*bias=*/true, 902));
  cases.push_back(std::make_unique<AttentionCase>(RopeMode::kNeox, 64, 61, 6, /*fused=*/true, /*bias=*/true, 903));
  run_cases(*rt, cases);
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
