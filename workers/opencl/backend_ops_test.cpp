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
// References: for the float ops, elementwise and row ops in double; rope is the CPU engine's own
// ops::rope_head; the matmul dequantizes the weights with inferd_kernels_cpu (scalar) and sums in
// double, so its bound covers float summation order only, not quantization error. For the exact ops
// (ops.h), the CPU engine's own code — kernels::type_kernels(type, isa)->quantize_act and ->dot,
// ops::rms_norm, kernels::silu, ops::rope_head and ops::attention_head — and every output must be
// the same float ("bit-exact"). The x86 matmul cases run against the AVX2 and the AVX-512 kernels
// each (one CpuOrder for both); a host without them reports those cases unsupported.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "inferd/kernels/cpu.h"
#include "inferd/kernels/gemm.h"
#include "inferd/kernels/quantize.h"
#include "inferd/opencl/ops.h"
#include "inferd/kv_cache.h"
#include "inferd/cpu_ops.h"  // the CPU backend's row operations, the reference
#include "test_device.h"
#include "inferd/kernels/test_weights.h"

namespace inferd::opencl {
namespace {

// The ops are held to the CPU kernels in the vec_dot matmul order (kernels::MatmulOrder); the repacked order's exact
// matmuls are tested through whole models (cl_engine_test.cpp: ClEngineFiles.*).
const kernels::ScopedMatmulOrder kVecDotOrder(kernels::MatmulOrder::kVecDot);

constexpr float kSentinel = -1234.0f;
constexpr int32_t kGuardTexels = 64;  // 1 KiB each side: room for a kernel that overshoots by a slice row

std::vector<float> random_values(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// The device tensors of one run, all in one storage and data type, all with guards.
class Harness {
 public:
  Harness(Runtime& rt, TensorFormat format) : rt_(rt), format_(format) {}

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
    const TensorDescriptor desc(shape, format_);
    if (Status fits = desc.fits(rt_.info()); !fits) return Status(Code::kUnimplemented, fits.message());
    auto t = Tensor::allocate(rt_, desc, AllocOptions{kGuardTexels});
    if (!t) return t.status();
    tensors_.push_back(std::make_unique<Tensor>(std::move(t.value())));
    INFERD_RETURN_IF_ERROR(fill_guards(rt_, *tensors_.back(), kSentinel));
    return tensors_.back().get();
  }

  Runtime& rt_;
  TensorFormat format_;
  std::vector<std::unique_ptr<Tensor>> tensors_;
};

#define ASSIGN_OR_RETURN(lhs, expr)       \
  auto lhs##_result = (expr);             \
  if (!lhs##_result) return lhs##_result.status(); \
  auto lhs = lhs##_result.value()

// The same into an existing variable (one statement: usable as an if's body).
#define ASSIGN_OR_RETURN_TO(var, expr)                 \
  do {                                                 \
    auto assign_result_ = (expr);                      \
    if (!assign_result_) return assign_result_.status(); \
    var = assign_result_.value();                      \
  } while (0)

class OpCase {
 public:
  virtual ~OpCase() = default;
  virtual std::string op() const = 0;
  virtual std::string params() const = 0;
  virtual std::string type() const { return "f32"; }
  virtual double max_nmse() const { return 1e-7; }
  // With every tensor in half precision (inputs rounded to half on upload, the output on every
  // write): each rounding is a relative error of at most 2^-11, an nmse of about 1e-7 per rounding
  // in the chain (measured at most 4.4e-7, the decode matmul's).
  virtual double max_nmse_f16() const { return 2e-6; }
  // An exact op (ops.h): every output must equal the reference's float (the reference being the CPU
  // engine's own code), not merely be close.
  virtual bool bit_exact() const { return false; }
  // An op of the exact numerics (ops.h), which reproduce the CPU engine's float activations: it has
  // no half-precision variant.
  virtual bool exact_numerics() const { return false; }
  // Runs the op on the device with every tensor in h's storage; `out` receives the output.
  virtual Status run(Ops& ops, Harness& h, std::vector<float>* out) = 0;
  virtual std::vector<float> reference() const = 0;
};

// ---- Cases ---------------------------------------------------------------------------------------

enum class Binary { kAdd, kMul, kSwiglu, kSwigluExact };

class BinaryCase final : public OpCase {
 public:
  BinaryCase(Binary kind, Bhwc shape, uint32_t seed)
      : kind_(kind), shape_(shape), a_(random_values(shape.elements(), seed, -4.0f, 4.0f)),
        b_(random_values(shape.elements(), seed + 1)) {}
  std::string op() const override {
    switch (kind_) {
      case Binary::kAdd: return "add";
      case Binary::kMul: return "mul";
      case Binary::kSwiglu: return "swiglu";
      case Binary::kSwigluExact: return "swiglu_exact";
    }
    return "?";
  }
  std::string params() const override { return shape_.to_string(); }
  bool bit_exact() const override { return kind_ != Binary::kSwiglu; }
  bool exact_numerics() const override { return kind_ == Binary::kSwigluExact; }
  Status run(Ops& ops, Harness& h, std::vector<float>* out) override {
    ASSIGN_OR_RETURN(a, h.input(shape_, a_));
    ASSIGN_OR_RETURN(b, h.input(shape_, b_));
    ASSIGN_OR_RETURN(d, h.output(shape_));
    switch (kind_) {
      case Binary::kAdd: INFERD_RETURN_IF_ERROR(ops.add(*a, *b, *d)); break;
      case Binary::kMul: INFERD_RETURN_IF_ERROR(ops.mul(*a, *b, *d)); break;
      case Binary::kSwiglu: INFERD_RETURN_IF_ERROR(ops.swiglu(*a, *b, *d)); break;
      case Binary::kSwigluExact: INFERD_RETURN_IF_ERROR(ops.swiglu_exact(*a, *b, *d)); break;
    }
    return h.finish(*d, out);
  }
  std::vector<float> reference() const override {
    std::vector<float> r(a_.size());
    for (size_t i = 0; i < r.size(); ++i) {
      const double a = a_[i], b = b_[i];
      switch (kind_) {
        case Binary::kAdd: r[i] = a_[i] + b_[i]; break;
        case Binary::kMul: r[i] = a_[i] * b_[i]; break;
        case Binary::kSwiglu: r[i] = static_cast<float>(a / (1.0 + std::exp(-a)) * b); break;
        case Binary::kSwigluExact: r[i] = kernels::silu(a_[i]) * b_[i]; break;
      }
    }
    return r;
  }

 private:
  Binary kind_;
  Bhwc shape_;
  std::vector<float> a_, b_;
};

// `group` channels per norm (0: the whole row; else each head of the row, as qwen3's Q/K norms).
class RmsNormCase final : public OpCase {
 public:
  RmsNormCase(Bhwc shape, uint32_t seed, bool exact = false, int32_t group = 0)
      : shape_(shape), exact_(exact), group_(group > 0 ? group : shape.c), x_(random_values(shape.elements(), seed)),
        w_(random_values(group_, seed + 1, 0.5f, 1.5f)) {}
  std::string op() const override { return exact_ ? "rms_norm_exact" : "rms_norm"; }
  std::string params() const override {
    return shape_.to_string() + (group_ != shape_.c ? ",group=" + std::to_string(group_) : "");
  }
  bool bit_exact() const override { return exact_; }
  bool exact_numerics() const override { return exact_; }
  Status run(Ops& ops, Harness& h, std::vector<float>* out) override {
    ASSIGN_OR_RETURN(x, h.input(shape_, x_));
    ASSIGN_OR_RETURN(w, h.input(Bhwc{1, 1, 1, group_}, w_));
    ASSIGN_OR_RETURN(d, h.output(shape_));
    INFERD_RETURN_IF_ERROR(exact_ ? ops.rms_norm_exact(*x, *w, kEps, *d) : ops.rms_norm(*x, *w, kEps, *d));
    return h.finish(*d, out);
  }
  std::vector<float> reference() const override {
    std::vector<float> r(x_.size());
    const size_t g = static_cast<size_t>(group_);
    if (exact_) {
      for (size_t at = 0; at < x_.size(); at += g) ops::rms_norm(&x_[at], w_.data(), &r[at], group_, kEps);
      return r;
    }
    for (size_t at = 0; at < x_.size(); at += g) {
      const float* x = &x_[at];
      double sum = 0.0;
      for (size_t c = 0; c < g; ++c) sum += double{x[c]} * x[c];
      const double scale = 1.0 / std::sqrt(sum / static_cast<double>(g) + kEps);
      for (size_t c = 0; c < g; ++c) r[at + c] = static_cast<float>(x[c] * scale * w_[c]);
    }
    return r;
  }

 private:
  static constexpr float kEps = 1e-5f;
  Bhwc shape_;
  bool exact_;
  int32_t group_;
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
  // `residual`: y = r + W x in one kernel (matmul_add), r random.
  MatmulCase(DType type, int64_t rows, int64_t k, int32_t tokens, MatmulVariant variant, uint32_t seed,
             bool residual = false)
      : type_(type), rows_(rows), k_(k), tokens_(tokens), variant_(variant),
        x_(random_values(int64_t{tokens} * k, seed + 1)),
        r_(residual ? random_values(int64_t{tokens} * rows, seed + 2) : std::vector<float>()) {
    const std::vector<float> w = random_values(rows * k, seed);
    const size_t row_bytes = dtype_row_bytes(type, k);
    weights_.resize(static_cast<size_t>(rows) * row_bytes);
    for (int64_t r = 0; r < rows; ++r) {
      kernels::testing::encode_weight_row(type, &w[static_cast<size_t>(r * k)], k, seed + static_cast<uint32_t>(r), 1.0f,
                                 &weights_[static_cast<size_t>(r) * row_bytes]);
    }
    // The reference multiplies by exactly the values the device sees: the dequantized weights.
    dequantized_.resize(static_cast<size_t>(rows * k));
    const kernels::TypeKernels* tk = kernels::type_kernels(type, kernels::Isa::kScalar);
    INFERD_ASSERT(tk != nullptr);
    for (int64_t r = 0; r < rows; ++r) {
      tk->to_float(&weights_[static_cast<size_t>(r) * row_bytes], &dequantized_[static_cast<size_t>(r * k)], k);
    }
  }
  std::string op() const override {
    return std::string("matmul_") + matmul_variant_name(variant_) + (r_.empty() ? "" : "_add");
  }
  std::string params() const override {
    return "rows=" + std::to_string(rows_) + ",k=" + std::to_string(k_) + ",tokens=" + std::to_string(tokens_);
  }
  std::string type() const override { return dtype_name(type_); }
  double max_nmse() const override { return 1e-6; }
  Status run(Ops& ops, Harness& h, std::vector<float>* out) override {
    auto w = MatmulWeights::upload(h.runtime(), type_, rows_, k_, weights_.data());
    if (!w) return w.status();
    ASSIGN_OR_RETURN(x, h.input(Bhwc{1, 1, tokens_, static_cast<int32_t>(k_)}, x_));
    const Bhwc ys{1, 1, tokens_, static_cast<int32_t>(rows_)};
    ASSIGN_OR_RETURN(y, h.output(ys));
    Tensor* res = nullptr;
    if (!r_.empty()) ASSIGN_OR_RETURN_TO(res, h.input(ys, r_));
    INFERD_RETURN_IF_ERROR(ops.matmul(w.value(), *x, *y, variant_, res));
    return h.finish(*y, out);
  }
  std::vector<float> reference() const override {
    std::vector<float> y(static_cast<size_t>(tokens_ * rows_));
    for (int32_t t = 0; t < tokens_; ++t) {
      for (int64_t r = 0; r < rows_; ++r) {
        double sum = r_.empty() ? 0.0 : r_[static_cast<size_t>(t * rows_ + r)];
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
  std::vector<float> x_, r_, dequantized_;
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
    void* dst = &out.bytes[static_cast<size_t>(r) * row_bytes];
    kernels::testing::encode_weight_row(type, &w[static_cast<size_t>(r * k)], k, seed + static_cast<uint32_t>(r), 1.0f, dst);
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
  bool bit_exact() const override { return true; }  // q * d, then + m: FP_CONTRACT OFF (codegen.h)
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
  SwigluHalvesCase(int32_t tokens, int32_t channels, uint32_t seed, bool exact = false)
      : tokens_(tokens), channels_(channels), exact_(exact),
        x_(random_values(int64_t{tokens} * 2 * channels, seed, -12.0f, 12.0f)) {}
  std::string op() const override { return exact_ ? "swiglu_halves_exact" : "swiglu_halves"; }
  std::string params() const override { return "tokens=" + std::to_string(tokens_) + ",c=" + std::to_string(channels_); }
  bool bit_exact() const override { return exact_; }
  bool exact_numerics() const override { return exact_; }
  Status run(Ops& ops, Harness& h, std::vector<float>* out) override {
    ASSIGN_OR_RETURN(x, h.input(Bhwc{1, 1, tokens_, 2 * channels_}, x_));
    ASSIGN_OR_RETURN(d, h.output(Bhwc{1, 1, tokens_, channels_}));
    INFERD_RETURN_IF_ERROR(exact_ ? ops.swiglu_halves_exact(*x, *d) : ops.swiglu_halves(*x, *d));
    return h.finish(*d, out);
  }
  std::vector<float> reference() const override {
    std::vector<float> r;
    for (int32_t t = 0; t < tokens_; ++t) {
      for (int32_t c = 0; c < channels_; ++c) {
        const float g = x_[static_cast<size_t>(t * 2 * channels_ + c)];
        const float u = x_[static_cast<size_t>(t * 2 * channels_ + channels_ + c)];
        r.push_back(exact_ ? kernels::silu(g) * u : static_cast<float>(g / (1.0 + std::exp(-double{g})) * u));
      }
    }
    return r;
  }

 private:
  int32_t tokens_, channels_;
  bool exact_;
  std::vector<float> x_;
};

// The CPU's own activation encoding of x for weights of `type` (quantize_act of `isa`: Q8_0 / Q8_1 /
// Q8_K blocks, a float copy for float weights), row by row.
std::vector<unsigned char> cpu_activations(DType type, const std::vector<float>& x, int32_t tokens, int64_t k,
                                           kernels::Isa isa = kernels::Isa::kScalar) {
  const kernels::TypeKernels* tk = kernels::type_kernels(type, isa);
  const size_t row_bytes = dtype_row_bytes(tk->act_type, k);
  std::vector<unsigned char> act(static_cast<size_t>(tokens) * row_bytes);
  for (int32_t t = 0; t < tokens; ++t) {
    tk->quantize_act(&x[static_cast<size_t>(t * k)], &act[static_cast<size_t>(t) * row_bytes], k);
  }
  return act;
}

// quantize_q8 against kernels/cpu/scalar.cpp's quantize_q8_1 (whose quants and d are Q8_0's): the
// quants (the output) and each block's d and s (checked in run()) byte for byte. Blocks of zeros, a
// block whose amax is negative and values rounding half-way are included.
class QuantizeQ8Case final : public OpCase {
 public:
  QuantizeQ8Case(int32_t tokens, int64_t k, uint32_t seed)
      : tokens_(tokens), k_(k), x_(random_values(int64_t{tokens} * k, seed, -3.0f, 3.0f)) {
    for (int j = 0; j < 32 && k >= 96; ++j) {
      x_[static_cast<size_t>(32 + j)] = 0.0f;  // token 0, block 1: zeros
      // Block 2: amax 127 at a negative value, so x * id = x exactly, and halves to round to even.
      x_[static_cast<size_t>(64 + j)] = j == 5 ? -127.0f : static_cast<float>(j % 7 - 3) + 0.5f;
    }
  }
  std::string op() const override { return "quantize_q8"; }
  std::string params() const override { return "tokens=" + std::to_string(tokens_) + ",k=" + std::to_string(k_); }
  bool bit_exact() const override { return true; }
  bool exact_numerics() const override { return true; }
  Status run(Ops& ops, Harness& h, std::vector<float>* out) override {
    const Bhwc xs{1, 1, tokens_, static_cast<int32_t>(k_)};
    ASSIGN_OR_RETURN(x, h.input(xs, x_));
    ASSIGN_OR_RETURN(q, h.output(xs));
    const size_t n_blocks = static_cast<size_t>(tokens_ * k_ / 32);
    auto scales = h.runtime().create_buffer(n_blocks * 2 * sizeof(float));
    if (!scales) return scales.status();
    INFERD_RETURN_IF_ERROR(ops.quantize_q8(*x, *q, scales->get()));
    std::vector<float> ds(n_blocks * 2);
    INFERD_RETURN_IF_ERROR(h.runtime().read_buffer(scales->get(), 0, ds.size() * sizeof(float), ds.data()));
    const std::vector<unsigned char> act = cpu_activations(DType::kQ4_1, x_, tokens_, k_);
    const auto* blocks = reinterpret_cast<const BlockQ8_1*>(act.data());
    for (size_t b = 0; b < n_blocks; ++b) {
      const float d = kernels::fp16_to_fp32(blocks[b].d), sum = kernels::fp16_to_fp32(blocks[b].s);
      if (ds[2 * b] != d || ds[2 * b + 1] != sum) {
        return make_error(Code::kCorrupt, "block %zu: (d, s) = (%.9g, %.9g), the CPU's (%.9g, %.9g)", b,
                          static_cast<double>(ds[2 * b]), static_cast<double>(ds[2 * b + 1]), static_cast<double>(d),
                          static_cast<double>(sum));
      }
    }
    return h.finish(*q, out);
  }
  std::vector<float> reference() const override {
    const std::vector<unsigned char> act = cpu_activations(DType::kQ4_1, x_, tokens_, k_);
    const auto* blocks = reinterpret_cast<const BlockQ8_1*>(act.data());
    std::vector<float> q;
    for (size_t b = 0; b < static_cast<size_t>(tokens_ * k_ / 32); ++b) {
      for (int8_t v : blocks[b].qs) q.push_back(v);
    }
    return q;
  }

 private:
  int32_t tokens_;
  int64_t k_;
  std::vector<float> x_;
};

// quantize_q8_k against the CPU engine's own quantize_q8_k (the host's best ISA; scalar.cpp's and the
// SIMD ones are byte-identical): the quants (the output) and each block's d and 16 sums (checked in
// run()) exactly. Token 0 has a block of zeros and a block whose largest magnitude appears twice with
// both signs (the first one's sign decides the scale's).
class QuantizeQ8KCase final : public OpCase {
 public:
  QuantizeQ8KCase(int32_t tokens, int64_t k, uint32_t seed)
      : tokens_(tokens), k_(k), x_(random_values(int64_t{tokens} * k, seed, -3.0f, 3.0f)) {
    if (k >= 768) {
      for (int j = 256; j < 512; ++j) x_[static_cast<size_t>(j)] = 0.0f;
      x_[512 + 9] = -4.5f;
      x_[512 + 200] = 4.5f;
    }
  }
  std::string op() const override { return "quantize_q8_k"; }
  std::string params() const override { return "tokens=" + std::to_string(tokens_) + ",k=" + std::to_string(k_); }
  bool bit_exact() const override { return true; }
  bool exact_numerics() const override { return true; }
  Status run(Ops& ops, Harness& h, std::vector<float>* out) override {
    const Bhwc xs{1, 1, tokens_, static_cast<int32_t>(k_)};
    ASSIGN_OR_RETURN(x, h.input(xs, x_));
    ASSIGN_OR_RETURN(q, h.output(xs));
    const size_t n_blocks = static_cast<size_t>(tokens_ * k_ / 256);
    auto blocks = h.runtime().create_buffer(n_blocks * kQ8KBlockFloats * sizeof(float));
    if (!blocks) return blocks.status();
    INFERD_RETURN_IF_ERROR(ops.quantize_q8_k(*x, *q, blocks->get()));
    std::vector<float> got(n_blocks * kQ8KBlockFloats);
    INFERD_RETURN_IF_ERROR(h.runtime().read_buffer(blocks->get(), 0, got.size() * sizeof(float), got.data()));
    const std::vector<unsigned char> act = cpu_activations(DType::kQ4_K, x_, tokens_, k_, kernels::best_isa());
    const auto* want = reinterpret_cast<const BlockQ8_K*>(act.data());
    for (size_t b = 0; b < n_blocks; ++b) {
      const float* g = &got[b * kQ8KBlockFloats];
      bool same = g[0] == want[b].d;
      for (int i = 0; i < 16; ++i) same = same && g[1 + i] == static_cast<float>(want[b].bsums[i]);
      if (!same) {
        return make_error(Code::kCorrupt, "block %zu: d %.9g, bsum[0] %g; the CPU's %.9g, %d", b,
                          static_cast<double>(g[0]), static_cast<double>(g[1]), static_cast<double>(want[b].d),
                          want[b].bsums[0]);
      }
    }
    return h.finish(*q, out);
  }
  std::vector<float> reference() const override {
    const std::vector<unsigned char> act = cpu_activations(DType::kQ4_K, x_, tokens_, k_, kernels::best_isa());
    const auto* blocks = reinterpret_cast<const BlockQ8_K*>(act.data());
    std::vector<float> q;
    for (size_t b = 0; b < static_cast<size_t>(tokens_ * k_ / 256); ++b) {
      for (int8_t v : blocks[b].qs) q.push_back(v);
    }
    return q;
  }

 private:
  int32_t tokens_;
  int64_t k_;
  std::vector<float> x_;
};

// matmul_exact (after quantize_q8 for block weights) against the CPU engine's dot kernel of `isa`
// for the same weights and activations it encoded itself: the same floats. The x86 kernels (AVX2,
// AVX-512) are matched by CpuOrder::kX86, the scalar ones by kScalar. The block types run with each
// IntDot form of their integer dots (int8: cl_khr_integer_dot_product's dot, emulated where absent).
class MatmulExactCase final : public OpCase {
 public:
  // `residual`: y = r + W x in one kernel (matmul_add), against the CPU's dot then a float add.
  MatmulExactCase(DType type, int64_t rows, int64_t k, int32_t tokens, MatmulVariant variant, kernels::Isa isa,
                  uint32_t seed, IntDot int_dot = IntDot::kFloat, bool residual = false)
      : type_(type), rows_(rows), k_(k), tokens_(tokens), variant_(variant), isa_(isa), int_dot_(int_dot),
        w_(random_weights(type, rows, k, seed)), x_(random_values(int64_t{tokens} * k, seed + 1, -3.0f, 3.0f)),
        r_(residual ? random_values(int64_t{tokens} * rows, seed + 2, -3.0f, 3.0f) : std::vector<float>()) {}
  std::string op() const override {
    return std::string("matmul_exact_") + matmul_variant_name(variant_) + (int_dot_ == IntDot::kInt8 ? "_int8" : "") +
           (r_.empty() ? "" : "_add");
  }
  std::string params() const override {
    return "rows=" + std::to_string(rows_) + ",k=" + std::to_string(k_) + ",tokens=" + std::to_string(tokens_) +
           ",cpu=" + kernels::isa_name(isa_);
  }
  std::string type() const override { return dtype_name(type_); }
  bool bit_exact() const override { return true; }
  bool exact_numerics() const override { return true; }
  Status run(Ops& ops, Harness& h, std::vector<float>* out) override {
    if (!kernels::isa_available(isa_)) {
      return make_error(Code::kUnimplemented, "this CPU cannot run the %s kernels to compare with", kernels::isa_name(isa_));
    }
    if (isa_ == kernels::Isa::kAvx2 && type_ == DType::kF32 && k_ % 8 >= 4) {
      // GCC vectorizes the AVX2 build's scalar tail of dot_float<float> (4 products, then sequential
      // adds; the rest fused): its last k % 8 products round differently from the AVX-512 build's.
      return Status(Code::kUnimplemented, "the CPU's AVX2 F32 tail of >= 4 elements is not the x86 order");
    }
    auto w = MatmulWeights::upload(h.runtime(), type_, rows_, k_, w_.bytes.data());
    if (!w) return w.status();
    const Bhwc xs{1, 1, tokens_, static_cast<int32_t>(k_)};
    ASSIGN_OR_RETURN(x, h.input(xs, x_));
    const Bhwc ys{1, 1, tokens_, static_cast<int32_t>(rows_)};
    ASSIGN_OR_RETURN(y, h.output(ys));
    Tensor* res = nullptr;
    if (!r_.empty()) ASSIGN_OR_RETURN_TO(res, h.input(ys, r_));
    const CpuOrder order = isa_ == kernels::Isa::kScalar ? CpuOrder::kScalar : CpuOrder::kX86;
    const MatmulActivations kind = matmul_activations(type_);
    ops.set_int_dot(int_dot_);
    if (kind == MatmulActivations::kFloat) {
      INFERD_RETURN_IF_ERROR(ops.matmul_exact(w.value(), *x, nullptr, *y, order, variant_, res));
    } else {
      ASSIGN_OR_RETURN(q, h.output(xs));
      const size_t floats = kind == MatmulActivations::kQ8 ? static_cast<size_t>(tokens_ * k_ / 32) * 2
                                                           : static_cast<size_t>(tokens_ * k_ / 256) * kQ8KBlockFloats;
      auto scales = h.runtime().create_buffer(floats * sizeof(float));
      if (!scales) return scales.status();
      INFERD_RETURN_IF_ERROR(kind == MatmulActivations::kQ8 ? ops.quantize_q8(*x, *q, scales->get())
                                                            : ops.quantize_q8_k(*x, *q, scales->get()));
      INFERD_RETURN_IF_ERROR(ops.matmul_exact(w.value(), *q, scales->get(), *y, order, variant_, res));
    }
    return h.finish(*y, out);
  }
  // The CPU's dots, then the residual added as one float add (the CPU engine's matmul_add).
  std::vector<float> reference() const override {
    std::vector<float> y = dots();
    for (size_t i = 0; i < r_.size(); ++i) y[i] = y[i] + r_[i];
    return y;
  }
  std::vector<float> dots() const {
    const kernels::TypeKernels* tk = kernels::type_kernels(type_, isa_);
    const std::vector<unsigned char> act = cpu_activations(type_, x_, tokens_, k_);
    const size_t act_bytes = act.size() / static_cast<size_t>(tokens_);
    const size_t row_bytes = dtype_row_bytes(type_, k_);
    std::vector<float> y(static_cast<size_t>(tokens_ * rows_));
    // In the repacked matmul order the CPU engine's GEMMs (whose values depend on the batch) and dots of that order.
    const bool repacked = kernels::matmul_order_for(type_, rows_) == kernels::MatmulOrder::kRepacked;
    if (repacked) {
      const kernels::GemmFn gemm =
          kernels::gemm_kernel_for(type_, WeightLayout::kRows, isa_, kernels::MatmulOrder::kRepacked);
      if (tokens_ > 1 && gemm != nullptr) {
        gemm({type_, k_, w_.bytes.data(), row_bytes, 0, rows_, act.data(), act_bytes, tokens_, y.data(), rows_, false,
              nullptr});
        return y;
      }
      tk = kernels::type_kernels(type_, isa_, kernels::MatmulOrder::kRepacked);
    }
    // The CPU engine runs two or more tokens of IQ4_NL through its GEMM, whose order (llamafile's) is not
    // the dot kernel's; every other type's GEMM gives its dot kernel's bits.
    if (type_ == DType::kIQ4_NL && tokens_ > 1 && !repacked) {
      if (kernels::GemmFn gemm = kernels::gemm_kernel(type_, isa_)) {
        gemm({type_, k_, w_.bytes.data(), row_bytes, 0, rows_, act.data(), act_bytes, tokens_, y.data(), rows_, false,
              nullptr});
        return y;
      }
    }
    for (int32_t t = 0; t < tokens_; ++t) {
      for (int64_t r = 0; r < rows_; ++r) {
        tk->dot(k_, &w_.bytes[static_cast<size_t>(r) * row_bytes], &act[static_cast<size_t>(t) * act_bytes], act_bytes, 1,
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
  kernels::Isa isa_;
  IntDot int_dot_;
  RandomWeights w_;
  std::vector<float> x_, r_;
};

// rope_kv and attention together, against the CPU engine's rope_head and a double-precision
// attention over the same half-rounded Q, K and V. A first pass writes `history` positions of slot
// 1; the tested pass has `tokens` more tokens of slot 1 and the first token of slot 0, so the output
// covers the cache written by an earlier pass, slot indexing, GQA, the causal mask within a pass and
// the KV length padded to a multiple of 64. Q|K|V come from one fused tensor or from three. The slots'
// blocks are interleaved and in reverse order in the pool (block 0 unused), so that a kernel addressing
// rows by (slot, position) instead of through the block tables fails.
//
// Exact: rope_kv and attention_exact against the CPU engine's own steps (engine.cpp run_pass: bias,
// ops::rope_head, Q rounded to half, K and V into an fp16 cache, ops::attention_head), bit for bit.
// The scores scratch holds 2 tokens, so the passes of more run in several launches.
class AttentionCase final : public OpCase {
 public:
  // chunk > 0: the float attention split over chunks of `chunk` positions (Ops::attention_chunk).
  AttentionCase(RopeMode mode, int32_t head_dim, int32_t history, int32_t tokens, bool fused, bool bias, uint32_t seed,
                bool exact = false, int32_t chunk = 0)
      : fused_(fused), history_(history), tokens_(tokens), bias_(bias), exact_(exact), chunk_(chunk) {
    g_.n_head = 4;
    g_.n_head_kv = 2;
    g_.head_dim = head_dim;
    g_.n_slots = 2;
    g_.n_ctx = history + tokens + 3;
    const int32_t bps = g_.blocks_per_slot();
    g_.n_blocks = 2 * bps + 1;
    g_.rope_base = 10000.0f;
    g_.rope_mode = mode;
    for (int32_t s = 0; s < 2; ++s) {
      for (int32_t i = 0; i < bps; ++i) table_.push_back(g_.n_blocks - 1 - (2 * i + s));
    }
    const int32_t qkv = g_.n_embd() + 2 * g_.n_embd_kv();
    for (int32_t t = 0; t < history; ++t) hist_.push_back({1, t});
    for (int32_t t = 0; t < tokens; ++t) pass_.push_back({1, history + t});
    pass_.push_back({0, 0});
    hist_x_ = random_values(int64_t{history} * qkv, seed, -2.0f, 2.0f);
    pass_x_ = random_values(static_cast<int64_t>(pass_.size()) * qkv, seed + 1, -2.0f, 2.0f);
    if (bias) bias_values_ = random_values(qkv, seed + 2, -0.5f, 0.5f);
  }
  std::string op() const override { return exact_ ? "rope_kv+attn_exact" : "rope_kv+attention"; }
  bool bit_exact() const override { return exact_; }
  bool exact_numerics() const override { return exact_; }
  std::string params() const override {
    return std::string(g_.rope_mode == RopeMode::kNeox ? "neox" : "normal") + ",d=" + std::to_string(g_.head_dim) +
           ",kv=" + std::to_string(history_) + "+" + std::to_string(tokens_) + (fused_ ? ",fused" : "") +
           (bias_ ? ",bias" : "") + (chunk_ > 0 ? ",chunk=" + std::to_string(chunk_) : "");
  }
  double max_nmse() const override { return 1e-6; }

  Status run(Ops& ops, Harness& h, std::vector<float>* out) override {
    Runtime& rt = h.runtime();
    auto cache = rt.create_buffer(g_.layer_cache_bytes());
    if (!cache) return cache.status();
    auto q_half = rt.create_buffer(std::max(hist_.size(), pass_.size()) * static_cast<size_t>(g_.n_embd()) * 2);
    if (!q_half) return q_half.status();
    std::vector<int32_t> table = table_;
    auto table_buf = rt.create_buffer(table.size() * sizeof(int32_t), CL_MEM_READ_ONLY, table.data());
    if (!table_buf) return table_buf.status();
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
      std::vector<float> trig = rope_table(pos, g_.head_dim, g_.rope_base);
      auto rope_buf = rt.create_buffer(trig.size() * sizeof(float), CL_MEM_READ_ONLY, trig.data());
      if (!pos_buf || !slot_buf) return !pos_buf ? pos_buf.status() : slot_buf.status();
      if (!rope_buf) return rope_buf.status();
      const TokenPlacement placement{pos_buf->get(), slot_buf->get(), rope_buf->get(), table_buf->get()};
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
      const float scale = 1.0f / std::sqrt(static_cast<float>(g_.head_dim));
      if (exact_) {
        auto scores = rt.create_buffer(Ops::attention_scratch_bytes(g_, 2, kv_pad));
        if (!scores) return scores.status();
        INFERD_RETURN_IF_ERROR(ops.attention_exact(g_, q_half->get(), placement, kv_pad, scale, cache->get(),
                                                   scores->get(), host_cpu_order(), *o));
        INFERD_RETURN_IF_ERROR(rt.finish());  // the scratch dies at the end of this block
      } else if (chunk_ > 0) {
        auto partials = rt.create_buffer(Ops::attention_partials_bytes(g_));
        if (!partials) return partials.status();
        const int32_t before = ops.attention_chunk();
        ops.set_attention_chunk(chunk_);
        const Status s = ops.attention(g_, q_half->get(), placement, kv_pad, scale, cache->get(), *o, 0, partials->get());
        ops.set_attention_chunk(before);
        INFERD_RETURN_IF_ERROR(s);
        INFERD_RETURN_IF_ERROR(rt.finish());  // the partials die at the end of this block
      } else {
        INFERD_RETURN_IF_ERROR(ops.attention(g_, q_half->get(), placement, kv_pad, scale, cache->get(), *o));
      }
      INFERD_RETURN_IF_ERROR(rt.finish());  // the per-pass buffers die at the end of this iteration
      last_out = o;
    }
    return h.finish(*last_out, out);
  }

  std::vector<float> reference() const override {
    if (exact_) return cpu_engine_reference();
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
  std::vector<float> cpu_engine_reference() const {
    const int32_t e = g_.n_embd(), ekv = g_.n_embd_kv(), hd = g_.head_dim, qkv = e + 2 * ekv;
    const RopeStyle style = g_.rope_mode == RopeMode::kNeox ? RopeStyle::kNeox : RopeStyle::kNormal;
    // K and V pools of [block][kv_head][64][head_dim], read through the same block tables.
    const size_t per_head = static_cast<size_t>(graph::kKvBlockTokens) * static_cast<size_t>(hd);
    const int64_t block_stride = static_cast<int64_t>(g_.n_head_kv) * static_cast<int64_t>(per_head);
    std::vector<fp16_t> kc(static_cast<size_t>(g_.n_blocks) * static_cast<size_t>(block_stride)), vc(kc.size());
    auto view = [&](std::vector<fp16_t>& c, int32_t slot, int32_t head) {
      return KvCache::View{&c[static_cast<size_t>(head) * per_head],
                           &table_[static_cast<size_t>(slot) * static_cast<size_t>(g_.blocks_per_slot())], block_stride,
                           hd};
    };
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    std::vector<float> out, scores(static_cast<size_t>(g_.n_ctx)), head_out(static_cast<size_t>(hd));
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
        for (int32_t hh = 0; hh < g_.n_head; ++hh) {
          float* qh = &row[static_cast<size_t>(hh * hd)];
          ops::rope_head(qh, hd, toks[t].pos, g_.rope_base, style);
          for (int32_t i = 0; i < hd; ++i) qh[i] = ops::round_fp16(qh[i]);
        }
        for (int32_t hh = 0; hh < g_.n_head_kv; ++hh) {
          float* kh = &row[static_cast<size_t>(e + hh * hd)];
          ops::rope_head(kh, hd, toks[t].pos, g_.rope_base, style);
          kernels::fp32_to_fp16_row(kh, view(kc, toks[t].slot, hh).row(toks[t].pos), hd);
          kernels::fp32_to_fp16_row(&row[static_cast<size_t>(e + ekv + hh * hd)], view(vc, toks[t].slot, hh).row(toks[t].pos), hd);
        }
        qs.emplace_back(row.begin(), row.begin() + e);
      }
      if (p == 0) continue;
      for (size_t t = 0; t < toks.size(); ++t) {
        for (int32_t hh = 0; hh < g_.n_head; ++hh) {
          const int32_t kvh = hh / (g_.n_head / g_.n_head_kv);
          ops::attention_head(&qs[t][static_cast<size_t>(hh * hd)], view(kc, toks[t].slot, kvh), view(vc, toks[t].slot, kvh),
                              hd, toks[t].pos + 1, scale, scores.data(), head_out.data());
          out.insert(out.end(), head_out.begin(), head_out.end());
        }
      }
    }
    return out;
  }

  AttentionGeometry g_;
  bool fused_;
  int32_t history_, tokens_;
  bool bias_, exact_;
  int32_t chunk_;
  std::vector<Token> hist_, pass_;
  std::vector<float> hist_x_, pass_x_, bias_values_;
  std::vector<int32_t> table_;  // [slot][blocks_per_slot] block ids
};

// ---- The driver ----------------------------------------------------------------------------------

using Cases = std::vector<std::unique_ptr<OpCase>>;

// Every case in every data type and storage of `storages` (all of them unless given).
void run_cases(Runtime& rt, const Cases& cases, std::span<const StorageType> storages = kAllStorageTypes) {
  Ops ops(rt);
  int passed = 0, unsupported = 0;
  for (const auto& c : cases) {
    for (DataType data_type : kAllDataTypes) {
    const bool half = data_type == DataType::kFloat16;
    if (half && c->exact_numerics()) continue;
    const double max_nmse = half ? c->max_nmse_f16() : c->max_nmse();
    // Rounding to half makes an op that is bit-exact in float merely close.
    const bool bit_exact = !half && c->bit_exact();
    for (StorageType storage : storages) {
      // Split textures in 3 parts (clamped per tensor to its slices), so that bands split unevenly.
      const TensorFormat format(storage, data_type, 3);
      const std::string what = c->op() + " " + c->params() + " " + format.to_string() + " " + c->type();
      Harness h(rt, format);
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
        if (bad.empty() && !(nmse <= max_nmse)) bad = std::string(buf) + " > " + std::to_string(max_nmse);
        int differ = 0;
        for (size_t i = 0; bit_exact && i < std::min(got.size(), ref.size()); ++i) {
          if (got[i] == ref[i] || (std::isnan(got[i]) && std::isnan(ref[i]))) continue;
          if (differ++ == 0 && bad.empty()) {
            char first[128];
            std::snprintf(first, sizeof(first), "output %zu is %.9g, the CPU's %.9g", i, static_cast<double>(got[i]),
                          static_cast<double>(ref[i]));
            bad = first;
          }
        }
        if (differ > 0) bad += " (" + std::to_string(differ) + " of " + std::to_string(ref.size()) + " differ)";
        if (bad.empty() && bit_exact) std::snprintf(buf, sizeof(buf), "bit-exact");
        if (bad.empty()) {
          verdict = std::string("OK ") + buf;
          ++passed;
        } else {
          verdict = "FAIL " + bad;
          ADD_FAILURE() << what << ": " << bad;
        }
      }
      std::printf("[backend-ops] %-14s %-28s %-17s %-5s %s\n", c->op().c_str(), c->params().c_str(),
                  format.to_string().c_str(), c->type().c_str(), verdict.c_str());
    }
    }
  }
  std::printf("[backend-ops] %d passed, %d unsupported, %zu kernels built on %s\n", passed, unsupported,
              ops.kernel_count(), rt.info().name.c_str());
}

// The storages differ only in how activations are read and outputs written, code that every weight type
// shares: `all` (every type) runs on a buffer, `spread` (the cases of one type) on every other storage in
// `storages` as well. The full product of types and storages compiled hundreds of programs, minutes on PoCL
// with an empty kernel cache.
void run_cases_spread(Runtime& rt, const Cases& all, const Cases& spread,
                      std::span<const StorageType> storages = kAllStorageTypes) {
  constexpr StorageType kBuffer[] = {StorageType::kBuffer};
  run_cases(rt, all, kBuffer);
  std::vector<StorageType> others;
  for (StorageType st : storages) {
    if (st != StorageType::kBuffer) others.push_back(st);
  }
  run_cases(rt, spread, others);
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
  // Per head: 4 and 3 groups of 64 and 12 channels.
  cases.push_back(std::make_unique<RmsNormCase>(Bhwc{1, 1, 5, 256}, seed++, false, 64));
  cases.push_back(std::make_unique<RmsNormCase>(Bhwc{1, 1, 3, 36}, seed++, false, 12));
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
Cases matmul_cases(DType type, uint32_t seed = 500) {
  struct Dims {
    int64_t rows, k;
  };
  const int64_t block = dtype_info(type)->block_size;
  const std::vector<Dims> dims = block == 256 ? std::vector<Dims>{{1, 256}, {3, 768}, {67, 256}, {9, 1280}}
                                 : block == 32 ? std::vector<Dims>{{1, 32}, {3, 96}, {67, 576}, {576, 64}}
                                               : std::vector<Dims>{{1, 1}, {3, 67}, {67, 576}, {576, 5}};
  const std::pair<int32_t, MatmulVariant> runs[] = {{1, MatmulVariant::kDecode},
                                                    {3, MatmulVariant::kDecode},
                                                    {5, MatmulVariant::kPrefill},
                                                    {8, MatmulVariant::kPrefill}};
  Cases cases;
  for (const Dims& d : dims) {
    for (const auto& [tokens, variant] : runs) {
      cases.push_back(std::make_unique<MatmulCase>(type, d.rows, d.k, tokens, variant, seed++));
    }
  }
  return cases;
}

// Runs `c` in `storage` on a fresh Ops that `configure` sets up. The first run's output becomes `want`;
// every later one must equal it bit for bit (counted in `compared`). False when this device lacks the
// storage (nothing compared).
bool expect_same_bits(Runtime& rt, OpCase& c, StorageType storage, const std::function<void(Ops&)>& configure,
                      std::vector<float>& want, int& compared) {
  Ops ops(rt);
  configure(ops);
  Harness h(rt, TensorFormat(storage));
  std::vector<float> got;
  const Status st = c.run(ops, h, &got);
  if (st.code() == Code::kUnimplemented) return false;
  if (!st) {
    ADD_FAILURE() << st.to_string();
    return true;
  }
  if (want.empty()) {
    want = got;
    return true;
  }
  EXPECT_EQ(got.size(), want.size());
  if (got.size() == want.size()) {
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  }
  ++compared;
  return true;
}

// The float decode matmul in every work-group shape (DecodeShape) gives the 1x1 shape's bits: the same
// partial sums in the same order. Rows that leave the last group of R slices short (67 rows: 17 slices)
// and inputs whose slices are no multiple of the lanes times U; guards and padding checked by the harness.
TEST(BackendOps, MatmulDecodeShapesGiveTheSameBits) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  std::vector<DecodeShape> shapes = decode_shape_candidates();
  shapes.push_back({3, 3});
  shapes.push_back({kMaxDecodeSlices, kMaxDecodeAhead});
  struct Dims {
    DType type;
    int64_t rows, k;
    StorageType storage;
  };
  const Dims dims[] = {{DType::kF32, 67, 580, StorageType::kBuffer},    {DType::kQ4_0, 67, 576, StorageType::kBuffer},
                       {DType::kQ4_0, 67, 576, StorageType::kTexture2D}, {DType::kQ4_K, 67, 768, StorageType::kBuffer},
                       {DType::kQ6_K, 5, 2560, StorageType::kBuffer}};
  int compared = 0;
  uint32_t seed = 900;
  for (const Dims& d : dims) {
    for (int32_t tokens : {1, 3}) {
      MatmulCase c(d.type, d.rows, d.k, tokens, MatmulVariant::kDecode, seed++);
      std::vector<float> want;
      for (const DecodeShape& shape : shapes) {
        SCOPED_TRACE(std::string(dtype_name(d.type)) + " " + c.params() + " " + storage_name(d.storage) + " " +
                     shape.to_string());
        auto configure = [&](Ops& ops) {
          ops.set_decode_shape(shape);
          EXPECT_EQ(ops.decode_shape(), shape);
        };
        if (!expect_same_bits(*rt, c, d.storage, configure, want, compared)) break;  // no images on this device
      }
    }
  }
  EXPECT_GT(compared, 0);
}

// The float prefill tiled in local memory sums each output in the simple kernel's order: the same bits, for
// tiles cut short in rows (67 rows: 17 slices, two tiles of 16), tokens (70: two tiles of 64) and input
// slices (k = 67: a last chunk of 1 of 8), in a buffer and a texture, with and without a residual.
TEST(BackendOps, MatmulTiledPrefillGivesTheSimpleKernelsBits) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  int compared = 0;
  uint32_t seed = 1300;
  struct Dims {
    DType type;
    int64_t rows, k;
  };
  for (const Dims& d : {Dims{DType::kF32, 67, 67}, Dims{DType::kQ4_0, 67, 576}, Dims{DType::kQ6_K, 5, 512},
                        Dims{DType::kF16, 130, 96}}) {
    for (int32_t tokens : {5, 70}) {
      for (bool residual : {false, true}) {
        MatmulCase c(d.type, d.rows, d.k, tokens, MatmulVariant::kPrefill, seed++, residual);
        for (StorageType storage : {StorageType::kBuffer, StorageType::kTexture2D}) {
          std::vector<float> want;
          for (PrefillKernel kernel : {PrefillKernel::kSimple, PrefillKernel::kTiled}) {
            SCOPED_TRACE(std::string(dtype_name(d.type)) + " " + c.params() + (residual ? " +res " : " ") +
                         storage_name(storage) + " " + prefill_kernel_name(kernel));
            auto configure = [&](Ops& ops) {
              ops.set_prefill_kernel(kernel);
              ops.set_prefill_tokens(4);
            };
            if (!expect_same_bits(*rt, c, storage, configure, want, compared)) break;
          }
        }
      }
    }
  }
  EXPECT_GT(compared, 0);
}

// The prefill matmuls' tokens per work-item change how often a weight slice is dequantized, not a sum:
// every value gives the same bits, float and exact (the exact ones against the CPU kernels besides),
// with token counts that leave the last work-item short.
TEST(BackendOps, MatmulPrefillTokensGiveTheSameBits) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  int compared = 0;
  uint32_t seed = 1200;
  for (DType type : {DType::kQ4_0, DType::kQ6_K, DType::kF16}) {
    const int64_t k = dtype_info(type)->block_size == 256 ? 512 : 96;
    for (int32_t tokens : {5, 19}) {
      MatmulCase c(type, 67, k, tokens, MatmulVariant::kPrefill, seed++);
      std::vector<float> want;
      for (int tt : {4, 1, 7, 16}) {
        SCOPED_TRACE(std::string(dtype_name(type)) + " " + c.params() + " tokens per item " + std::to_string(tt));
        expect_same_bits(*rt, c, StorageType::kBuffer, [&](Ops& ops) { ops.set_prefill_tokens(tt); }, want, compared);
      }
      MatmulExactCase e(type, 67, k, tokens, MatmulVariant::kPrefill, kernels::Isa::kAvx2, seed++);
      std::vector<float> cpu = e.reference();  // every run's bits
      for (int tt : {4, 1, 3, 8}) {
        SCOPED_TRACE(std::string("exact ") + dtype_name(type) + " " + e.params() + " tokens per item " + std::to_string(tt));
        // Not run: a device without the exact kernels, or a CPU without the AVX2 ones to compare with.
        auto configure = [&](Ops& ops) { ops.set_exact_prefill_tokens(tt); };
        if (!expect_same_bits(*rt, e, StorageType::kBuffer, configure, cpu, compared)) break;
      }
    }
  }
  EXPECT_GT(compared, 0);
}

// For each storage (buffer, then texture2d) and each of `shapes`: Ops set to the decode shape, a Harness in the
// storage and x (tokens x k, the values xv) uploaded, then body(ops, h, x). A storage this device cannot
// hold (no images) is skipped.
template <class Body>
void for_each_decode_setup(Runtime& rt, const std::string& what, int32_t tokens, int64_t k, const std::vector<float>& xv,
                           const std::vector<DecodeShape>& shapes, Body body) {
  for (StorageType storage : {StorageType::kBuffer, StorageType::kTexture2D}) {
    for (const DecodeShape& shape : shapes) {
      SCOPED_TRACE(what + " tokens " + std::to_string(tokens) + " " + storage_name(storage) + " " + shape.to_string());
      Ops ops(rt);
      ops.set_decode_shape(shape);
      Harness h(rt, TensorFormat(storage));
      auto x = h.input(Bhwc{1, 1, tokens, static_cast<int32_t>(k)}, xv);
      if (x.status().code() == Code::kUnimplemented) break;
      ASSERT_TRUE(x.is_ok()) << x.status().to_string();
      body(ops, h, *x.value());
    }
  }
}

// matmul_swiglu (a decode step's stacked gate|up matmul with SwiGLU in its store) gives the bits of the
// decode matmul then swiglu_halves, in every decode shape, for short last groups (F = 68: 17 slices) and a
// texture; shapes that are not a decode step's are refused.
TEST(BackendOps, MatmulSwigluEqualsMatmulThenSwiglu) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  int compared = 0;
  uint32_t seed = 1400;
  for (DType type : {DType::kQ4_0, DType::kQ4_K, DType::kF16}) {
    const int64_t k = dtype_info(type)->block_size == 256 ? 512 : 96, f = 68;
    const RandomWeights rw = random_weights(type, 2 * f, k, seed++);
    auto w = MatmulWeights::upload(*rt, type, 2 * f, k, rw.bytes.data());
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    for (int32_t tokens : {1, 3}) {
      const std::vector<float> xv = random_values(int64_t{tokens} * k, seed++);
      for_each_decode_setup(*rt, dtype_name(type), tokens, k, xv, decode_shape_candidates(),
                            [&](Ops& ops, Harness& h, const Tensor& x) {
        auto gate_up = h.output(Bhwc{1, 1, tokens, static_cast<int32_t>(2 * f)});
        auto apart = h.output(Bhwc{1, 1, tokens, static_cast<int32_t>(f)});
        auto fused = h.output(Bhwc{1, 1, tokens, static_cast<int32_t>(f)});
        ASSERT_TRUE(gate_up.is_ok() && apart.is_ok() && fused.is_ok());
        ASSERT_TRUE(ops.matmul(w.value(), x, *gate_up.value(), MatmulVariant::kDecode).is_ok());
        ASSERT_TRUE(ops.swiglu_halves(*gate_up.value(), *apart.value()).is_ok());
        const Status st = ops.matmul_swiglu(w.value(), x, *fused.value());
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        std::vector<float> want, got;
        ASSERT_TRUE(h.finish(*apart.value(), &want).is_ok());
        ASSERT_TRUE(h.finish(*fused.value(), &got).is_ok());
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
        ++compared;
      });
    }
    // Not a decode step (4 tokens), or dst not half the matrix's rows.
    Ops ops(*rt);
    auto x4 = Tensor::allocate(*rt, TensorDescriptor(Bhwc{1, 1, 4, static_cast<int32_t>(k)}, StorageType::kBuffer));
    auto d4 = Tensor::allocate(*rt, TensorDescriptor(Bhwc{1, 1, 4, static_cast<int32_t>(f)}, StorageType::kBuffer));
    auto x1 = Tensor::allocate(*rt, TensorDescriptor(Bhwc{1, 1, 1, static_cast<int32_t>(k)}, StorageType::kBuffer));
    auto d1 = Tensor::allocate(*rt, TensorDescriptor(Bhwc{1, 1, 1, static_cast<int32_t>(2 * f)}, StorageType::kBuffer));
    ASSERT_TRUE(x4.is_ok() && d4.is_ok() && x1.is_ok() && d1.is_ok());
    EXPECT_EQ(ops.matmul_swiglu(w.value(), x4.value(), d4.value()).code(), Code::kInvalidArgument);
    EXPECT_EQ(ops.matmul_swiglu(w.value(), x1.value(), d1.value()).code(), Code::kInvalidArgument);
  }
  EXPECT_GT(compared, 0);
}

// An RMSNorm folded into the decode matmuls that read it (Ops::DecodeNorm): the plain, residual and SwiGLU
// decode kernels against rms_norm() then the same kernel without the norm, one and several slices per group,
// both storages,
// a row whose channels are not a multiple of 4 (F16). Other float sums (each group sums the squares): close,
// not equal. A norm on a prefill matmul, or of another width, is refused.
TEST(BackendOps, MatmulWithNormEqualsRmsNormThenMatmul) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  int compared = 0;
  uint32_t seed = 1500;
  for (DType type : {DType::kQ4_0, DType::kQ8_0, DType::kF16}) {
    const int64_t k = type == DType::kF16 ? 98 : 96, f = 68;
    const RandomWeights rw = random_weights(type, 2 * f, k, seed++);
    auto w = MatmulWeights::upload(*rt, type, 2 * f, k, rw.bytes.data());
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    const std::vector<float> nv = random_values(k, seed++, 0.5f, 1.5f);
    for (int32_t tokens : {1, 3}) {
      const std::vector<float> xv = random_values(int64_t{tokens} * k, seed++, -3.0f, 3.0f);
      const std::vector<float> rv = random_values(int64_t{tokens} * 2 * f, seed++);
      for_each_decode_setup(*rt, dtype_name(type), tokens, k, xv, {DecodeShape{1, 1}, DecodeShape{4, 1}},
                            [&](Ops& ops, Harness& h, const Tensor& x) {
        auto nw = h.input(Bhwc{1, 1, 1, static_cast<int32_t>(k)}, nv);
        auto res = h.input(Bhwc{1, 1, tokens, static_cast<int32_t>(2 * f)}, rv);
        auto xn = h.output(Bhwc{1, 1, tokens, static_cast<int32_t>(k)});
        ASSERT_TRUE(nw.is_ok() && res.is_ok() && xn.is_ok());
        ASSERT_TRUE(ops.rms_norm(x, *nw.value(), 1e-5f, *xn.value()).is_ok());
        const DecodeNorm norm{nw.value(), 1e-5f};
        for (int variant = 0; variant < 3; ++variant) {  // plain, residual, SwiGLU
          const int32_t out = variant == 2 ? static_cast<int32_t>(f) : static_cast<int32_t>(2 * f);
          auto apart = h.output(Bhwc{1, 1, tokens, out});
          auto folded = h.output(Bhwc{1, 1, tokens, out});
          ASSERT_TRUE(apart.is_ok() && folded.is_ok());
          Status a, b;
          if (variant == 2) {
            a = ops.matmul_swiglu(w.value(), *xn.value(), *apart.value());
            b = ops.matmul_swiglu(w.value(), x, *folded.value(), &norm);
          } else {
            const Tensor* r = variant == 1 ? res.value() : nullptr;
            a = ops.matmul(w.value(), *xn.value(), *apart.value(), MatmulVariant::kDecode, r);
            b = ops.matmul(w.value(), x, *folded.value(), MatmulVariant::kDecode, r, &norm);
          }
          ASSERT_TRUE(a.is_ok()) << a.to_string();
          ASSERT_TRUE(b.is_ok()) << b.to_string();
          std::vector<float> want, got;
          ASSERT_TRUE(h.finish(*apart.value(), &want).is_ok());
          ASSERT_TRUE(h.finish(*folded.value(), &got).is_ok());
          ASSERT_EQ(got.size(), want.size());
          float scale = 0.0f, diff = 0.0f;
          for (size_t i = 0; i < want.size(); ++i) {
            scale = std::max(scale, std::fabs(want[i]));
            diff = std::max(diff, std::fabs(got[i] - want[i]));
          }
          EXPECT_LE(diff, 1e-5f * scale + 1e-6f) << "variant " << variant;
          ++compared;
        }
      });
    }
    // Not a decode step (4 tokens), or a norm of another width.
    Ops ops(*rt);
    auto x4 = Tensor::allocate(*rt, TensorDescriptor(Bhwc{1, 1, 4, static_cast<int32_t>(k)}, StorageType::kBuffer));
    auto y4 = Tensor::allocate(*rt, TensorDescriptor(Bhwc{1, 1, 4, static_cast<int32_t>(2 * f)}, StorageType::kBuffer));
    auto x1 = Tensor::allocate(*rt, TensorDescriptor(Bhwc{1, 1, 1, static_cast<int32_t>(k)}, StorageType::kBuffer));
    auto y1 = Tensor::allocate(*rt, TensorDescriptor(Bhwc{1, 1, 1, static_cast<int32_t>(2 * f)}, StorageType::kBuffer));
    auto n4 = Tensor::allocate(*rt, TensorDescriptor(Bhwc{1, 1, 1, static_cast<int32_t>(k)}, StorageType::kBuffer));
    auto nbad = Tensor::allocate(*rt, TensorDescriptor(Bhwc{1, 1, 1, 4}, StorageType::kBuffer));
    ASSERT_TRUE(x4.is_ok() && y4.is_ok() && x1.is_ok() && y1.is_ok() && n4.is_ok() && nbad.is_ok());
    const DecodeNorm good{&n4.value(), 1e-5f}, bad{&nbad.value(), 1e-5f};
    EXPECT_EQ(ops.matmul(w.value(), x4.value(), y4.value(), MatmulVariant::kAuto, nullptr, &good).code(),
              Code::kInvalidArgument);
    EXPECT_EQ(ops.matmul(w.value(), x1.value(), y1.value(), MatmulVariant::kDecode, nullptr, &bad).code(),
              Code::kInvalidArgument);
  }
  EXPECT_GT(compared, 0);
}

// The stacked Q|K|V decode matmul with rope_kv in its store (Ops::matmul_rope_kv) writes the Q halves and the
// cache rows matmul() then rope_kv() write, bit for bit: heads of 8 and 64, one and three tokens in two slots
// (positions in the first and second KV block), with and without biases and a Q scale, one and four slices per
// work-group. NeoX RoPE is refused, as are weights that are not Q|K|V.
TEST(BackendOps, MatmulRopeKvEqualsMatmulThenRopeKv) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  int compared = 0;
  uint32_t seed = 1600;
  for (int32_t head_dim : {8, 64}) {
    AttentionGeometry g;
    g.n_head = 4;
    g.n_head_kv = 2;
    g.head_dim = head_dim;
    g.n_slots = 2;
    g.n_ctx = 80;
    const int32_t bps = g.blocks_per_slot();
    g.n_blocks = 2 * bps + 1;
    g.rope_base = 10000.0f;
    g.rope_mode = RopeMode::kNormal;
    std::vector<int32_t> table;
    for (int32_t sl = 0; sl < 2; ++sl) {
      for (int32_t i = 0; i < bps; ++i) table.push_back(g.n_blocks - 1 - (2 * i + sl));
    }
    const int64_t k = 96, rows = g.n_embd() + 2 * g.n_embd_kv();
    const RandomWeights rw = random_weights(DType::kQ4_0, rows, k, seed++);
    auto w = MatmulWeights::upload(*rt, DType::kQ4_0, rows, k, rw.bytes.data());
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    const std::vector<float> bias_values = random_values(rows, seed++, -0.5f, 0.5f);
    auto bias = rt->create_buffer(bias_values.size() * sizeof(float), CL_MEM_READ_ONLY, bias_values.data());
    auto table_buf = rt->create_buffer(table.size() * sizeof(int32_t), CL_MEM_READ_ONLY, table.data());
    ASSERT_TRUE(bias.is_ok() && table_buf.is_ok());
    for (int32_t tokens : {1, 3}) {
      const std::vector<int32_t> pos = std::vector<int32_t>{70, 5, 0}, slots = {1, 0, 1};
      const std::vector<int32_t> p(pos.begin(), pos.begin() + tokens), sl(slots.begin(), slots.begin() + tokens);
      const std::vector<float> trig = rope_table(p, head_dim, g.rope_base);
      auto pos_buf = rt->create_buffer(p.size() * sizeof(int32_t), CL_MEM_READ_ONLY, p.data());
      auto slot_buf = rt->create_buffer(sl.size() * sizeof(int32_t), CL_MEM_READ_ONLY, sl.data());
      auto rope_buf = rt->create_buffer(trig.size() * sizeof(float), CL_MEM_READ_ONLY, trig.data());
      ASSERT_TRUE(pos_buf.is_ok() && slot_buf.is_ok() && rope_buf.is_ok());
      const TokenPlacement placement{pos_buf->get(), slot_buf->get(), rope_buf->get(), table_buf->get()};
      const std::vector<float> xv = random_values(int64_t{tokens} * k, seed++);
      auto x = Tensor::allocate(*rt, TensorDescriptor(Bhwc{1, 1, tokens, static_cast<int32_t>(k)}, StorageType::kBuffer));
      auto y = Tensor::allocate(*rt, TensorDescriptor(Bhwc{1, 1, tokens, static_cast<int32_t>(rows)}, StorageType::kBuffer));
      ASSERT_TRUE(x.is_ok() && y.is_ok());
      ASSERT_TRUE(upload(*rt, x.value(), xv).is_ok());
      const size_t q_bytes = static_cast<size_t>(tokens) * static_cast<size_t>(g.n_embd()) * 2;
      for (const DecodeShape& shape : {DecodeShape{1, 1}, DecodeShape{4, 1}}) {
        for (const bool with_bias : {false, true}) {
          for (const float q_scale : {0.0f, 0.375f}) {
            SCOPED_TRACE("head_dim " + std::to_string(head_dim) + " tokens " + std::to_string(tokens) + " " +
                         shape.to_string() + (with_bias ? " bias" : "") + " q_scale " + std::to_string(q_scale));
            Ops ops(*rt);
            ops.set_decode_shape(shape);
            const std::vector<uint8_t> zeros(std::max(g.layer_cache_bytes(), q_bytes), 0);
            std::vector<uint8_t> q_out[2], cache_out[2];
            for (int fused = 0; fused < 2; ++fused) {
              auto q = rt->create_buffer(q_bytes, CL_MEM_READ_WRITE, zeros.data());
              auto cache = rt->create_buffer(g.layer_cache_bytes(), CL_MEM_READ_WRITE, zeros.data());
              ASSERT_TRUE(q.is_ok() && cache.is_ok());
              cl_mem b = with_bias ? bias->get() : nullptr;
              Status st;
              if (fused == 1) {
                st = ops.matmul_rope_kv(w.value(), x.value(), nullptr, g, b, placement, q->get(), cache->get(), q_scale);
              } else {
                st = ops.matmul(w.value(), x.value(), y.value(), MatmulVariant::kDecode);
                const int32_t e4 = g.n_embd() / 4, ekv4 = g.n_embd_kv() / 4;
                if (st) {
                  st = ops.rope_kv(g, {&y.value(), 0}, {&y.value(), e4}, {&y.value(), e4 + ekv4}, b, placement, q->get(),
                                   cache->get(), q_scale);
                }
              }
              ASSERT_TRUE(st.is_ok()) << st.to_string();
              q_out[fused].resize(q_bytes);
              cache_out[fused].resize(g.layer_cache_bytes());
              ASSERT_TRUE(rt->read_buffer(q->get(), 0, q_bytes, q_out[fused].data()).is_ok());
              ASSERT_TRUE(rt->read_buffer(cache->get(), 0, cache_out[fused].size(), cache_out[fused].data()).is_ok());
            }
            EXPECT_EQ(q_out[0], q_out[1]) << "Q";
            EXPECT_EQ(cache_out[0], cache_out[1]) << "cache";
            EXPECT_NE(cache_out[1], std::vector<uint8_t>(cache_out[1].size(), 0)) << "the rows were written";
            ++compared;
          }
        }
      }
      // NeoX pairs span work-groups; weights of another height are not Q|K|V.
      Ops ops(*rt);
      AttentionGeometry neox = g;
      neox.rope_mode = RopeMode::kNeox;
      auto q = rt->create_buffer(q_bytes);
      auto cache = rt->create_buffer(g.layer_cache_bytes());
      ASSERT_TRUE(q.is_ok() && cache.is_ok());
      EXPECT_EQ(ops.matmul_rope_kv(w.value(), x.value(), nullptr, neox, nullptr, placement, q->get(), cache->get()).code(),
                Code::kUnimplemented);
      AttentionGeometry wider = g;
      wider.n_head = 8;
      EXPECT_EQ(ops.matmul_rope_kv(w.value(), x.value(), nullptr, wider, nullptr, placement, q->get(), cache->get()).code(),
                Code::kInvalidArgument);
    }
  }
  EXPECT_GT(compared, 0);
}

TEST(BackendOps, DecodeShapesParseAndPrint) {
  EXPECT_EQ(DecodeShape{}.to_string(), "1x1");
  for (const DecodeShape& shape : decode_shape_candidates()) {
    auto back = parse_decode_shape(shape.to_string());
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(back.value(), shape);
  }
  EXPECT_EQ(parse_decode_shape("8x8")->to_string(), "8x8");
  for (const char* bad : {"", "x", "4", "4x", "x4", "0x1", "1x0", "9x1", "1x9", "4X1", "4x1 ", "-1x2", "04x1x"}) {
    EXPECT_EQ(parse_decode_shape(bad).status().code(), Code::kInvalidArgument) << bad;
  }
}

// matmul with a residual (the graph's matmul_add): y = r + W x in one kernel, every variant and storage,
// against a float reference; the exact kernels against the CPU's dot then one float add, bit for bit.
TEST(BackendOps, MatmulAdd) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  Cases all, spread;
  uint32_t seed = 1000;
  for (DType type : {DType::kF16, DType::kQ4_0, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    const int64_t k = dtype_info(type)->block_size == 256 ? 512 : 96;
    for (const auto& [tokens, variant] : {std::pair{1, MatmulVariant::kDecode}, std::pair{5, MatmulVariant::kPrefill}}) {
      all.push_back(std::make_unique<MatmulCase>(type, 67, k, tokens, variant, seed, /*residual=*/true));
      if (type == DType::kQ4_0) {
        spread.push_back(std::make_unique<MatmulCase>(type, 67, k, tokens, variant, seed, /*residual=*/true));
      }
      ++seed;
    }
  }
  run_cases_spread(*rt, all, spread);
}

TEST(BackendOps, MatmulExactAddEqualsTheCpuKernels) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  Cases cases;
  uint32_t seed = 1100;
  for (DType type : {DType::kF32, DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    const int64_t k = dtype_info(type)->block_size == 256 ? 512 : 96;
    for (const auto& [tokens, variant] : {std::pair{1, MatmulVariant::kDecode}, std::pair{5, MatmulVariant::kPrefill}}) {
      cases.push_back(std::make_unique<MatmulExactCase>(type, 67, k, tokens, variant, kernels::Isa::kAvx2, seed++,
                                                        IntDot::kFloat, /*residual=*/true));
    }
  }
  run_cases(*rt, cases, std::array{StorageType::kBuffer, StorageType::kTexture2D});
}

// A residual of another shape, or the output's own memory, is refused before anything runs.
TEST(BackendOps, MatmulAddRejectsBadResiduals) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  Ops ops(*rt);
  const RandomWeights rw = random_weights(DType::kQ8_0, 8, 64, 7);
  auto w = MatmulWeights::upload(*rt, DType::kQ8_0, 8, 64, rw.bytes.data());
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  auto x = Tensor::allocate(*rt, TensorDescriptor(Bhwc{1, 1, 1, 64}, StorageType::kBuffer));
  auto y = Tensor::allocate(*rt, TensorDescriptor(Bhwc{1, 1, 1, 8}, StorageType::kBuffer));
  auto other = Tensor::allocate(*rt, TensorDescriptor(Bhwc{1, 1, 2, 8}, StorageType::kBuffer));
  ASSERT_TRUE(x.is_ok() && y.is_ok() && other.is_ok());
  EXPECT_EQ(ops.matmul(w.value(), x.value(), y.value(), MatmulVariant::kDecode, &other.value()).code(),
            Code::kInvalidArgument);
  const Status same = ops.matmul(w.value(), x.value(), y.value(), MatmulVariant::kDecode, &y.value());
  EXPECT_EQ(same.code(), Code::kInvalidArgument);
  EXPECT_NE(same.message().find("own memory"), std::string::npos) << same.message();
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

TEST(BackendOps, MatmulBF16) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  run_cases(*rt, matmul_cases(DType::kBF16));
}

TEST(BackendOps, MatmulQ5_0) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  run_cases(*rt, matmul_cases(DType::kQ5_0));
}

TEST(BackendOps, MatmulQ5_1) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  run_cases(*rt, matmul_cases(DType::kQ5_1));
}

// Q5_0 and Q5_1 keep 5 bits per weight on the device (nibbles + a plane of fifth bits), plus a float
// scale (and min) per row and 32 weights: 6 and 7 bits per weight, below the file's 5.5 and 6 + 1.
// The 5- and 6-bit codes keep their bits on the device (low nibbles plus a plane of high bits),
// so weights take about what the file takes. Bits per weight, scales and mins included (the test
// counts them in eighths):
//   Q5_0  4 + 1 + 32/32 (d)                         = 6      (the file: 5.5)
//   Q5_1  4 + 1 + 32/32 (d) + 32/32 (m)             = 7      (6)
//   Q5_K  4 + 1 + 32/256 (d) + 32/256 (dmin) + 128/256 (8-bit scales and mins) = 5.75   (5.5)
//   Q6_K  4 + 2 + 32/256 (d) + 128/256 (scales)     = 6.625  (6.5625)
// (before they were packed: 8 bits per code, 2 to 3 bits per weight more).
TEST(BackendOps, FiveAndSixBitWeightsArePackedOnTheDevice) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  constexpr int64_t kRows = 64, kK = 512;
  for (auto [type, eighths] : {std::pair{DType::kQ5_0, 48}, std::pair{DType::kQ5_1, 56}, std::pair{DType::kQ5_K, 46},
                               std::pair{DType::kQ6_K, 53}}) {
    const RandomWeights w = random_weights(type, kRows, kK, 5);
    auto up = MatmulWeights::upload(*rt, type, kRows, kK, w.bytes.data());
    ASSERT_TRUE(up.is_ok()) << up.status().to_string();
    EXPECT_EQ(up->device_bytes(), static_cast<size_t>(kRows * kK * eighths / 64)) << dtype_name(type);
    EXPECT_NE(up->high_bits(), nullptr);
  }
}

TEST(BackendOps, MatmulQ4_K) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  run_cases(*rt, matmul_cases(DType::kQ4_K));
}

TEST(BackendOps, MatmulQ5_K) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  run_cases(*rt, matmul_cases(DType::kQ5_K));
}

TEST(BackendOps, MatmulQ6_K) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  run_cases(*rt, matmul_cases(DType::kQ6_K));
}

// Q2_K, Q3_K, IQ4_NL and IQ4_XS (the codes in nibbles, as Q4_0's and Q4_K's). Seeds of their own: with
// seed 500, IQ4_NL's single 32-element output (1 row, k = 32) nearly cancels, and the half-precision
// input's rounding, relative to that small sum, passes the f16 bound (nmse 5.1e-6).
TEST(BackendOps, MatmulLowBitTypes) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  uint32_t seed = 1500;
  for (DType type : {DType::kQ2_K, DType::kQ3_K, DType::kIQ4_NL, DType::kIQ4_XS}) {
    if (type == DType::kQ2_K) {
      run_cases(*rt, matmul_cases(type, seed));
    } else {
      constexpr StorageType kBuffer[] = {StorageType::kBuffer};
      run_cases(*rt, matmul_cases(type, seed), kBuffer);  // Q2_K's cases cover the other storages
    }
    seed += 100;
  }
}

// Bits per weight of the low-bit types on the device, in eighths (the file's in brackets): their codes
// take a nibble each, so Q2_K and Q3_K take more than the file (2 and 1 bits per weight more).
//   Q2_K    4 + 32/256 (d) + 32/256 (dmin) + 256/256 (8-bit scales and mins) = 5.25   (2.625)
//   Q3_K    4 + 32/256 (d) + 128/256 (8-bit scales)                           = 4.625  (3.4375)
//   IQ4_NL  4 + 32/32 (d)                                                     = 5      (4.5)
//   IQ4_XS  4 + 32/256 (d) + 128/256 (8-bit scales, 8 of 16 used)              = 4.625  (4.25)
TEST(BackendOps, LowBitWeightsKeepTheirCodesInNibbles) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  constexpr int64_t kRows = 64, kK = 512;
  for (auto [type, eighths] : {std::pair{DType::kQ2_K, 42}, std::pair{DType::kQ3_K, 37}, std::pair{DType::kIQ4_NL, 40},
                               std::pair{DType::kIQ4_XS, 37}}) {
    const RandomWeights w = random_weights(type, kRows, kK, 5);
    auto up = MatmulWeights::upload(*rt, type, kRows, kK, w.bytes.data());
    ASSERT_TRUE(up.is_ok()) << up.status().to_string();
    EXPECT_EQ(up->device_bytes(), static_cast<size_t>(kRows * kK * eighths / 64)) << dtype_name(type);
  }
}

TEST(BackendOps, GetRows) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  auto add_cases = [](Cases& cases, DType type, uint32_t seed) {
    const int64_t block = dtype_info(type)->block_size;
    const int64_t k1 = block == 256 ? 256 : block == 32 ? 64 : 5, k2 = block == 256 ? 768 : block == 32 ? 96 : 67;
    cases.push_back(std::make_unique<GetRowsCase>(type, 7, k1, std::vector<int32_t>{6, 0, 3, 3, 5}, seed));
    cases.push_back(std::make_unique<GetRowsCase>(type, 13, k2, std::vector<int32_t>{12}, seed + 1));
  };
  Cases all, spread;
  uint32_t seed = 600;
  for (DType type : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                     DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ2_K, DType::kQ3_K, DType::kIQ4_NL,
                     DType::kIQ4_XS}) {
    add_cases(all, type, seed);
    seed += 2;
  }
  add_cases(spread, DType::kQ4_0, 700);
  run_cases_spread(*rt, all, spread);
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

// The exact ops against the CPU engine's own code, bit for bit (ops.h's exact numerics).
TEST(BackendOps, ExactRowOps) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  if (!Ops(*rt).exact_supported()) GTEST_SKIP() << rt->info().name << " has no cl_khr_fp64 for the exact ops";
  Cases cases;
  uint32_t seed = 1000;
  for (const Bhwc& s : {Bhwc{1, 1, 1, 1}, Bhwc{1, 2, 7, 67}, Bhwc{1, 1, 5, 576}, Bhwc{1, 1, 2, 1536}}) {
    cases.push_back(std::make_unique<RmsNormCase>(s, seed++, /*exact=*/true));
  }
  cases.push_back(std::make_unique<RmsNormCase>(Bhwc{1, 1, 5, 256}, seed++, /*exact=*/true, 64));
  cases.push_back(std::make_unique<RmsNormCase>(Bhwc{1, 1, 3, 36}, seed++, /*exact=*/true, 12));
  for (const Bhwc& s : kElementwiseShapes) cases.push_back(std::make_unique<BinaryCase>(Binary::kSwigluExact, s, seed++));
  cases.push_back(std::make_unique<SwigluHalvesCase>(1, 4, seed++, /*exact=*/true));
  cases.push_back(std::make_unique<SwigluHalvesCase>(5, 1536, seed++, /*exact=*/true));
  cases.push_back(std::make_unique<QuantizeQ8Case>(1, 96, seed++));
  cases.push_back(std::make_unique<QuantizeQ8Case>(7, 1536, seed++));
  cases.push_back(std::make_unique<QuantizeQ8KCase>(1, 256, seed++));
  cases.push_back(std::make_unique<QuantizeQ8KCase>(5, 1536, seed++));
  run_cases(*rt, cases);
}

// matmul_exact against the CPU's dot kernel of every ISA this host runs, decode and prefill, partial
// tiles of tokens included: the 32-element block types with k not a multiple of 256, the K-quants
// with k multiples of 256 (not all of 512), F32 / F16 / BF16 with a tail of k % 8 elements.
Cases matmul_exact_cases(std::initializer_list<DType> types, uint32_t seed) {
  struct Dims {
    int64_t rows, k;
  };
  const std::pair<int32_t, MatmulVariant> runs[] = {
      {1, MatmulVariant::kDecode}, {3, MatmulVariant::kDecode}, {5, MatmulVariant::kPrefill}, {8, MatmulVariant::kPrefill}};
  Cases cases;
  for (kernels::Isa isa : {kernels::Isa::kAvx512, kernels::Isa::kAvx2, kernels::Isa::kScalar}) {
    for (DType type : types) {
      const int64_t block = dtype_info(type)->block_size;
      const std::vector<Dims> dims = block == 256 ? std::vector<Dims>{{3, 256}, {67, 768}, {9, 1280}}
                                     : block == 32 ? std::vector<Dims>{{3, 96}, {67, 576}, {9, 1568}}
                                                   : std::vector<Dims>{{3, 67}, {67, 576}, {5, 29}};
      for (const Dims& d : dims) {
        for (const auto& [tokens, variant] : runs) {
          cases.push_back(std::make_unique<MatmulExactCase>(type, d.rows, d.k, tokens, variant, isa, seed++));
          if (matmul_activations(type) == MatmulActivations::kQ8) {
            cases.push_back(
                std::make_unique<MatmulExactCase>(type, d.rows, d.k, tokens, variant, isa, seed++, IntDot::kInt8));
          }
        }
      }
    }
  }
  return cases;
}

// Every type in every CPU order on a buffer, the `spread` types on every storage too (run_cases_spread).
void run_matmul_exact(Runtime& rt, std::initializer_list<DType> types, std::initializer_list<DType> spread,
                      uint32_t seed, std::span<const StorageType> storages = kAllStorageTypes) {
  run_cases_spread(rt, matmul_exact_cases(types, seed), matmul_exact_cases(spread, seed), storages);
}

TEST(BackendOps, MatmulExactEqualsTheCpuKernels) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  if (!Ops(*rt).exact_supported()) GTEST_SKIP() << rt->info().name << " has no cl_khr_fp64 for the exact ops";
  run_matmul_exact(*rt, {DType::kQ4_1, DType::kQ8_0, DType::kQ4_0, DType::kQ5_0, DType::kQ5_1, DType::kF32, DType::kF16,
                         DType::kBF16},
                   {DType::kQ4_1, DType::kF16}, 1100);
}

TEST(BackendOps, MatmulExactKQuantsEqualTheCpuKernels) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  if (!Ops(*rt).exact_supported()) GTEST_SKIP() << rt->info().name << " has no cl_khr_fp64 for the exact ops";
  run_matmul_exact(*rt, {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}, {DType::kQ4_K}, 1200);
}

// IQ4_NL's dims have odd block counts (3 and 49 blocks: the vec_dot's unpaired last block). In a buffer
// and a split texture only.
TEST(BackendOps, MatmulExactLowBitTypesEqualTheCpuKernels) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  if (!Ops(*rt).exact_supported()) GTEST_SKIP() << rt->info().name << " has no cl_khr_fp64 for the exact ops";
  constexpr StorageType kStorages[] = {StorageType::kBuffer, StorageType::kTexture2DSplit};
  run_matmul_exact(*rt, {DType::kQ2_K, DType::kQ3_K, DType::kIQ4_NL, DType::kIQ4_XS}, {DType::kIQ4_NL}, 1300, kStorages);
}

// The repacked (llama.cpp's default) matmul order: Q2_K, Q3_K, Q5_K, Q6_K and IQ4_XS through the tiled K-quant
// GEMM's steps at 8 tokens, vec_dot's below (the dims' row counts are not multiples of 8, so Q2_K is tiled in either
// llama.cpp build's order and Q4_K keeps the vec_dot order). In a buffer and a split texture only.
TEST(BackendOps, MatmulExactTiledOrderEqualsTheCpuGemms) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  if (!Ops(*rt).exact_supported()) GTEST_SKIP() << rt->info().name << " has no cl_khr_fp64 for the exact ops";
  const kernels::ScopedMatmulOrder repacked(kernels::MatmulOrder::kRepacked);
  constexpr StorageType kStorages[] = {StorageType::kBuffer, StorageType::kTexture2DSplit};
  run_matmul_exact(*rt, {DType::kQ2_K, DType::kQ3_K, DType::kQ5_K, DType::kQ6_K, DType::kIQ4_XS}, {}, 1400, kStorages);
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

// The float attention split over chunks of positions (GPUs' decode; Ops::attention_chunk): 8 chunks of
// 16 positions, chunks past some tokens' positions (the pass's token at position 0 has one), and a KV
// long enough for kMaxAttentionChunks chunks of 4 to be too few (the chunks grow to 6 positions).
TEST(BackendOps, RopeKvAndSplitAttention) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  Cases cases;
  cases.push_back(std::make_unique<AttentionCase>(RopeMode::kNormal, 64, 70, 5, false, false, 904, false, 16));
  cases.push_back(std::make_unique<AttentionCase>(RopeMode::kNeox, 8, 130, 1, true, true, 905, false, 4));
  cases.push_back(std::make_unique<AttentionCase>(RopeMode::kNeox, 128, 100, 2, true, false, 906, false, 64));
  run_cases(*rt, cases);
}

// The exact attention in this process's CPU order (host_cpu_order(), the order ops::attention_head
// sums in), llama and NeoX rope, head sizes with and without an 8-element step and a 4-element tail,
// KV lengths past several 16-position chunks.
TEST(BackendOps, RopeKvAndAttentionExact) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  if (!Ops(*rt).exact_supported()) GTEST_SKIP() << rt->info().name << " has no cl_khr_fp64 for the exact ops";
  Cases cases;
  cases.push_back(std::make_unique<AttentionCase>(RopeMode::kNormal, 8, 3, 2, true, false, 950, /*exact=*/true));
  cases.push_back(std::make_unique<AttentionCase>(RopeMode::kNormal, 64, 70, 5, false, false, 951, true));
  cases.push_back(std::make_unique<AttentionCase>(RopeMode::kNormal, 12, 40, 3, true, true, 952, true));
  cases.push_back(std::make_unique<AttentionCase>(RopeMode::kNeox, 8, 1, 4, false, true, 953, true));
  cases.push_back(std::make_unique<AttentionCase>(RopeMode::kNeox, 64, 61, 6, true, true, 954, true));
  cases.push_back(std::make_unique<AttentionCase>(RopeMode::kNeox, 24, 130, 1, false, false, 955, true));
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

// Float and half tensors mix in one kernel (the engine adds a half projection into its float
// residual stream): each combination of formats is its own kernel, and the result is the float sum
// of the half-rounded input, rounded as the output's type says.
TEST(BackendOps, MixedDataTypesInOneKernel) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  const Bhwc shape{1, 1, 5, 7};
  auto round_half = [](float v) { return kernels::fp16_to_fp32(kernels::fp32_to_fp16(v)); };
  const std::vector<float> va = random_values(shape.elements(), 3), vb = random_values(shape.elements(), 4);
  Ops ops(*rt);
  size_t combinations = 0;
  for (DataType out_type : kAllDataTypes) {
    const TensorDescriptor da(shape, StorageType::kBuffer), db(shape, StorageType::kBuffer, DataType::kFloat16),
        dd(shape, StorageType::kBuffer, out_type);
    auto a = Tensor::allocate(*rt, da);
    auto b = Tensor::allocate(*rt, db);
    auto d = Tensor::allocate(*rt, dd);
    ASSERT_TRUE(a.is_ok() && b.is_ok() && d.is_ok());
    ASSERT_TRUE(upload(*rt, a.value(), va).is_ok());
    ASSERT_TRUE(upload(*rt, b.value(), vb).is_ok());
    ASSERT_TRUE(ops.add(a.value(), b.value(), d.value()).is_ok());
    EXPECT_EQ(ops.kernel_count(), ++combinations);
    std::vector<float> got(va.size());
    ASSERT_TRUE(download(*rt, d.value(), got).is_ok());
    for (size_t i = 0; i < got.size(); ++i) {
      const float sum = va[i] + round_half(vb[i]);
      EXPECT_EQ(got[i], out_type == DataType::kFloat16 ? round_half(sum) : sum) << i;
    }
  }
}

// Bad shapes and types are error values, never crashes.
TEST(BackendOps, RejectsBadArguments) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  Ops ops(*rt);
  auto make = [&](Bhwc s) { return std::move(Tensor::allocate(*rt, TensorDescriptor(s, StorageType::kBuffer)).value()); };
  Tensor a = make({1, 1, 3, 5}), b = make({1, 1, 3, 6}), w = make({1, 1, 1, 6}), d = make({1, 1, 3, 5});
  EXPECT_EQ(ops.add(a, b, d).code(), Code::kInvalidArgument);
  EXPECT_EQ(ops.rms_norm(a, w, 1e-5f, d).code(), Code::kInvalidArgument);  // 6 channels do not divide 5
  Tensor x12 = make({1, 1, 3, 12}), d12 = make({1, 1, 3, 12});
  EXPECT_EQ(ops.rms_norm(x12, w, 1e-5f, d12).code(), Code::kUnimplemented);  // groups of 6: not whole slices
  EXPECT_EQ(ops.softmax(a, b, 1.0f, d).code(), Code::kInvalidArgument);

  auto pos = rt->create_buffer(sizeof(int32_t));
  ASSERT_TRUE(pos.is_ok());
  Tensor r = make({1, 2, 3, 8}), rd = make({1, 2, 3, 8});
  EXPECT_EQ(ops.rope(r, pos->get(), 10000.0f, RopeMode::kNormal, rd).code(), Code::kInvalidArgument);  // 1 position

  const std::vector<unsigned char> bytes(4096, 0);
  EXPECT_EQ(MatmulWeights::upload(*rt, DType::kQ8_0, 2, 33, bytes.data()).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(MatmulWeights::upload(*rt, DType::kQ4_K, 2, 128, bytes.data()).status().code(), Code::kInvalidArgument);
  // Q8_K is an activation type, never a matmul weight.
  EXPECT_EQ(MatmulWeights::upload(*rt, DType::kQ8_K, 2, 256, bytes.data()).status().code(), Code::kUnimplemented);
  EXPECT_EQ(MatmulWeights::upload(*rt, DType::kF32, 0, 4, bytes.data()).status().code(), Code::kInvalidArgument);
  auto mw = MatmulWeights::upload(*rt, DType::kF32, 4, 6, bytes.data());
  ASSERT_TRUE(mw.is_ok());
  EXPECT_EQ(ops.matmul(mw.value(), a, d).code(), Code::kInvalidArgument);  // k = 5, not 6

  // The exact ops reproduce float activations: half tensors are refused, naming the tensor.
  if (ops.exact_supported()) {
    auto half = [&](Bhwc s) {
      return std::move(Tensor::allocate(*rt, TensorDescriptor(s, StorageType::kBuffer, DataType::kFloat16)).value());
    };
    Tensor hx = half({1, 1, 2, 6}), hy = half({1, 1, 2, 4}), hw = half({1, 1, 1, 6});
    const Status s = ops.matmul_exact(mw.value(), hx, nullptr, hy, CpuOrder::kX86);
    EXPECT_EQ(s.code(), Code::kInvalidArgument);
    EXPECT_NE(s.message().find("buffer(f16)"), std::string::npos) << s.message();
    EXPECT_EQ(ops.rms_norm_exact(hx, hw, 1e-5f, hx).code(), Code::kInvalidArgument);
    EXPECT_EQ(ops.swiglu_exact(hx, hx, hx).code(), Code::kInvalidArgument);
  }
}

TEST(BackendOps, StageChoosesTheMatmulKernel) {
  EXPECT_EQ(choose_matmul_variant(1), MatmulVariant::kDecode);
  EXPECT_EQ(choose_matmul_variant(3), MatmulVariant::kDecode);
  EXPECT_EQ(choose_matmul_variant(4), MatmulVariant::kPrefill);
  EXPECT_EQ(choose_matmul_variant(512), MatmulVariant::kPrefill);
}

}  // namespace
}  // namespace inferd::opencl
