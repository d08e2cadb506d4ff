// inferd-opencl-info: what the OpenCL backend sees on this machine.
//
// Prints the DeviceInfo of every device, the storage the chooser picks for each kind of tensor of a
// reference model (Qwen2-0.5B's shapes) on the selected device, and the time of each op on a few
// shapes (median wall time of --reps runs after one warm-up, each run waited for). No assertions:
// correctness is inferd_opencl_test's job. --decode-shapes times the float decode matmul of an 8B-shaped
// gate|up projection (28672 x 4096, larger than a GPU's L2) in every work-group shape (ops.h DecodeShape),
// with the weights' read rate: what the load-time measurement chooses among.
//
//   inferd-opencl-info [--device SELECTOR] [--reps N] [--no-timing] [--all-storages] [--decode-shapes]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "inferd/kernels/cpu.h"
#include "inferd/kernels/quantize.h"
#include "inferd/opencl/cl_runtime.h"
#include "inferd/opencl/ops.h"
#include "inferd/opencl/tensor_desc.h"

namespace inferd::opencl {
namespace {

struct Options {
  std::string device;
  int reps = 5;
  bool timing = true;
  bool all_storages = false;
  bool decode_shapes = false;
};

// Qwen2-0.5B.
constexpr int32_t kEmbd = 896, kFf = 4864, kHeads = 14, kHeadDim = 64, kVocab = 151936;

void print_storage_choices(const DeviceInfo& info) {
  struct Kind {
    const char* name;
    Bhwc shape;
  };
  std::printf("\nStorage per tensor kind on %s (Qwen2-0.5B shapes):\n", info.name.c_str());
  for (int32_t tokens : {1, 512}) {
    const Kind kinds[] = {
        {"hidden state", {1, 1, tokens, kEmbd}},
        {"ffn activation", {1, 1, tokens, kFf}},
        {"q heads", {1, kHeads, tokens, kHeadDim}},
        {"attention scores (kv 4096)", {1, kHeads, tokens, 4096}},
        {"logits", {1, 1, tokens, kVocab}},
    };
    for (const Kind& k : kinds) {
      auto choice = choose_storage(info, k.shape);
      // What every storage would say, so that limits show on devices that prefer buffers too.
      std::string fits;
      for (StorageType storage : kAllStorageTypes) {
        const int32_t parts = storage == StorageType::kTexture2DSplit ? split_parts(info, k.shape) : 1;
        const Status s = TensorDescriptor(k.shape, storage, DataType::kFloat32, parts).fits(info);
        fits += (fits.empty() ? "" : "; ") + (s ? std::string(storage_name(storage)) + " fits" : s.message());
      }
      std::printf("  %-28s %-14s %-14s [%s]\n", k.name, k.shape.to_string().c_str(),
                  choice ? choice->to_string().c_str() : choice.status().to_string().c_str(), fits.c_str());
    }
  }
}

std::vector<float> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Median milliseconds per launch of `reps` runs of `batch` launches of `op` each, enqueued back to back
// before one wait (a GPU's kernel of tens of microseconds is not hidden behind the host's launch and wait),
// after one warm-up run that also builds the kernel.
Result<double> time_batched(Runtime& rt, int reps, int batch, const std::function<Status()>& op) {
  INFERD_RETURN_IF_ERROR(op());
  INFERD_RETURN_IF_ERROR(rt.finish());
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    for (int b = 0; b < batch; ++b) INFERD_RETURN_IF_ERROR(op());
    INFERD_RETURN_IF_ERROR(rt.finish());
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / batch);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Median milliseconds of `reps` runs of `op`, each waited for.
Result<double> time_op(Runtime& rt, int reps, const std::function<Status()>& op) { return time_batched(rt, reps, 1, op); }

Result<Tensor> make_tensor(Runtime& rt, const Bhwc& shape, StorageType storage, uint32_t seed) {
  auto t = Tensor::allocate(rt, TensorDescriptor(shape, storage));
  if (!t) return t.status();
  INFERD_RETURN_IF_ERROR(upload(rt, t.value(), random_values(shape.elements(), seed)));
  return t;
}

void report(const char* op, const std::string& shape, StorageType storage, const Result<double>& ms,
            double bytes = 0.0) {
  if (!ms) {
    std::printf("  %-26s %-26s %-12s %s\n", op, shape.c_str(), storage_name(storage), ms.status().to_string().c_str());
    return;
  }
  std::printf("  %-26s %-26s %-12s %9.3f ms", op, shape.c_str(), storage_name(storage), ms.value());
  if (bytes > 0.0) std::printf("  %7.2f GB/s", bytes / (ms.value() * 1e6));
  std::printf("\n");
}

void time_ops(Runtime& rt, const Options& options) {
  Ops ops(rt);
  std::printf("\nOp timings (median of %d runs, reduce work-group %zu):\n", options.reps, ops.reduce_group_size());
  std::vector<StorageType> storages;
  if (options.all_storages) {
    storages.assign(std::begin(kAllStorageTypes), std::end(kAllStorageTypes));
  } else {
    storages.push_back(storage_preference(rt.info()).front());
  }
  for (StorageType storage : storages) {
    for (int32_t tokens : {1, 64}) {
      const Bhwc hidden{1, 1, tokens, kEmbd}, ffn{1, 1, tokens, kFf}, heads{1, kHeads, tokens, kHeadDim};
      auto a = make_tensor(rt, ffn, storage, 1), b = make_tensor(rt, ffn, storage, 2), d = make_tensor(rt, ffn, storage, 3);
      auto h = make_tensor(rt, hidden, storage, 4), hw = make_tensor(rt, Bhwc{1, 1, 1, kEmbd}, storage, 5),
           hd = make_tensor(rt, hidden, storage, 6);
      auto q = make_tensor(rt, heads, storage, 7), qd = make_tensor(rt, heads, storage, 8);
      const Bhwc scores{1, kHeads, tokens, 1024};
      auto s = make_tensor(rt, scores, storage, 9), sm = make_tensor(rt, Bhwc{1, 1, tokens, 1024}, storage, 10),
           sd = make_tensor(rt, scores, storage, 11);
      if (!a || !b || !d || !h || !hw || !hd || !q || !qd || !s || !sm || !sd) {
        std::printf("  %s: cannot allocate the tensors for %d tokens\n", storage_name(storage), tokens);
        continue;
      }
      report("add", ffn.to_string(), storage,
             time_op(rt, options.reps, [&] { return ops.add(a.value(), b.value(), d.value()); }));
      report("mul", ffn.to_string(), storage,
             time_op(rt, options.reps, [&] { return ops.mul(a.value(), b.value(), d.value()); }));
      report("swiglu", ffn.to_string(), storage,
             time_op(rt, options.reps, [&] { return ops.swiglu(a.value(), b.value(), d.value()); }));
      report("rms_norm", hidden.to_string(), storage,
             time_op(rt, options.reps, [&] { return ops.rms_norm(h.value(), hw.value(), 1e-6f, hd.value()); }));
      std::vector<int32_t> positions(static_cast<size_t>(tokens));
      for (int32_t i = 0; i < tokens; ++i) positions[static_cast<size_t>(i)] = i;
      auto pos = rt.create_buffer(positions.size() * sizeof(int32_t), CL_MEM_READ_ONLY, positions.data());
      if (pos) {
        report("rope_neox", heads.to_string(), storage, time_op(rt, options.reps, [&] {
                 return ops.rope(q.value(), pos->get(), 1000000.0f, RopeMode::kNeox, qd.value());
               }));
      }
      report("softmax", scores.to_string(), storage,
             time_op(rt, options.reps, [&] { return ops.softmax(s.value(), sm.value(), 0.125f, sd.value()); }));

      const int64_t rows = kFf, k = kEmbd;  // the FFN's up projection
      auto upload = [&](DType type) {
        const std::vector<float> w = random_values(rows * k, 12);
        const size_t row_bytes = dtype_row_bytes(type, k);
        std::vector<unsigned char> bytes(static_cast<size_t>(rows) * row_bytes);
        for (int64_t r = 0; r < rows; ++r) {
          void* dst = &bytes[static_cast<size_t>(r) * row_bytes];
          if (type == DType::kF16) {
            kernels::fp32_to_fp16_row(&w[static_cast<size_t>(r * k)], static_cast<fp16_t*>(dst), k);
          } else {
            kernels::quantize_row_ref(type, &w[static_cast<size_t>(r * k)], dst, k);
          }
        }
        return MatmulWeights::upload(rt, type, rows, k, bytes.data());
      };
      auto y = Tensor::allocate(rt, TensorDescriptor(Bhwc{1, 1, tokens, static_cast<int32_t>(rows)}, storage));
      if (!y) continue;
      const MatmulVariant variant = choose_matmul_variant(tokens);
      for (DType type : {DType::kF16, DType::kQ8_0, DType::kQ4_0}) {
        auto weights = upload(type);
        if (!weights) continue;
        const std::string name = std::string("matmul_") + matmul_variant_name(variant) + " " + dtype_name(type);
        report(name.c_str(), "4864x896 x " + hidden.to_string(), storage,
               time_op(rt, options.reps, [&] { return ops.matmul(weights.value(), h.value(), y.value(), variant); }),
               static_cast<double>(weights->device_bytes()));
      }
      // The exact matmuls (the engine's default numerics) on Q8 activations, with each form of the
      // integer dots (IntDot; int8 is emulated where the device lacks cl_khr_integer_dot_product).
      if (!ops.exact_supported()) continue;
      auto quants = make_tensor(rt, hidden, storage, 13);
      auto scales = rt.create_buffer(static_cast<size_t>(tokens) * (kEmbd / 32) * 2 * sizeof(float));
      if (!quants || !scales || !ops.quantize_q8(h.value(), quants.value(), scales->get()).is_ok()) continue;
      for (DType type : {DType::kQ8_0, DType::kQ4_0}) {
        auto weights = upload(type);
        if (!weights) continue;
        for (IntDot mode : {IntDot::kFloat, IntDot::kInt8}) {
          ops.set_int_dot(mode);
          const std::string name =
              std::string("exact_") + matmul_variant_name(variant) + " " + dtype_name(type) + " " + int_dot_name(mode);
          report(name.c_str(), "4864x896 x " + hidden.to_string(), storage, time_op(rt, options.reps, [&] {
                   return ops.matmul_exact(weights.value(), quants.value(), scales->get(), y.value(), CpuOrder::kX86,
                                           variant);
                 }),
                 static_cast<double>(weights->device_bytes()));
        }
      }
      ops.set_int_dot(choose_int_dot(rt.info()));
    }
  }
}

// The float decode matmul of one token through a 28672 x 4096 matrix (larger than a GPU's L2) in every
// DecodeShape and, in buffers, by lane count.
void time_decode_shapes(Runtime& rt, const Options& options) {
  constexpr int64_t rows = 28672, k = 4096;
  constexpr int kBatch = 10;
  std::printf("\nDecode matmul by work-group shape (%lld x %lld, 1 token, median of %d runs of %d launches):\n",
              static_cast<long long>(rows), static_cast<long long>(k), options.reps, kBatch);
  std::vector<DecodeShape> shapes = decode_shape_candidates();
  shapes.push_back({2, 2});
  shapes.push_back({1, 8});
  shapes.push_back({4, 4});
  shapes.push_back({8, 2});
  for (DType type : {DType::kQ4_0, DType::kQ8_0}) {
    const size_t row_bytes = dtype_row_bytes(type, k);
    std::vector<unsigned char> bytes(static_cast<size_t>(rows) * row_bytes);
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> w = random_values(k, 100 + static_cast<uint32_t>(r));
      kernels::quantize_row_ref(type, w.data(), &bytes[static_cast<size_t>(r) * row_bytes], k);
    }
    auto weights = MatmulWeights::upload(rt, type, rows, k, bytes.data());
    if (!weights) {
      std::printf("  %s: %s\n", dtype_name(type), weights.status().to_string().c_str());
      continue;
    }
    for (StorageType storage : {StorageType::kBuffer, StorageType::kTexture2D}) {
      auto x = make_tensor(rt, Bhwc{1, 1, 1, static_cast<int32_t>(k)}, storage, 7);
      auto y = Tensor::allocate(rt, TensorDescriptor(Bhwc{1, 1, 1, static_cast<int32_t>(rows)}, storage));
      if (!x || !y) continue;
      const std::vector<size_t> lane_counts =
          storage == StorageType::kBuffer ? std::vector<size_t>{32, 64, 128, 256} : std::vector<size_t>{0};
      for (const size_t lanes : lane_counts) {
        for (const DecodeShape& shape : shapes) {
          Ops ops(rt);
          if (lanes != 0) ops.set_reduce_group_size(lanes);
          ops.set_decode_shape(shape);
          const std::string name = std::string("decode ") + dtype_name(type) + " " + shape.to_string() + " l" +
                                   std::to_string(ops.reduce_group_size());
          report(name.c_str(), "28672x4096 x 1x1x1x4096", storage, time_batched(rt, options.reps, kBatch, [&] {
                   return ops.matmul(weights.value(), x.value(), y.value(), MatmulVariant::kDecode);
                 }),
                 static_cast<double>(weights->device_bytes()));
        }
      }
    }
  }
}

int run(const Options& options) {
  auto devices = list_devices();
  if (!devices) {
    std::fprintf(stderr, "inferd-opencl-info: %s\n", devices.status().to_string().c_str());
    return 1;
  }
  for (size_t i = 0; i < devices->size(); ++i) {
    std::printf("Device %zu: %s", i, (*devices)[i].info.to_string().c_str());
  }
  auto rt = Runtime::create_default(RuntimeOptions{QueuePriority::kLow, false, default_cache_dir()}, options.device);
  if (!rt) {
    std::fprintf(stderr, "inferd-opencl-info: %s\n", rt.status().to_string().c_str());
    return 1;
  }
  std::printf("\nSelected: %s; queue priority %s; program cache %s\n", rt.value()->info().name.c_str(),
              queue_priority_name(rt.value()->queue_priority()),
              rt.value()->options().cache_dir.empty() ? "off" : rt.value()->options().cache_dir.c_str());
  const IntDot int_dot = choose_int_dot(rt.value()->info());
  std::printf("Exact matmuls form their int8 dot products with %s\n",
              int_dot == IntDot::kInt8 ? "cl_khr_integer_dot_product (int8)"
                                       : "float dot() (no cl_khr_integer_dot_product with 4x8-bit inputs)");
  print_storage_choices(rt.value()->info());
  if (options.timing) time_ops(*rt.value(), options);
  if (options.decode_shapes) time_decode_shapes(*rt.value(), options);
  const ProgramCacheStats& stats = rt.value()->cache_stats();
  std::printf("\nPrograms: %d compiled, %d from the disk cache, %d rejected entries\n", stats.compiled,
              stats.disk_hits, stats.disk_rejected);
  return 0;
}

}  // namespace
}  // namespace inferd::opencl

int main(int argc, char** argv) {
  inferd::opencl::Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--device" && i + 1 < argc) {
      options.device = argv[++i];
    } else if (arg == "--reps" && i + 1 < argc) {
      options.reps = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--no-timing") {
      options.timing = false;
    } else if (arg == "--all-storages") {
      options.all_storages = true;
    } else if (arg == "--decode-shapes") {
      options.decode_shapes = true;
    } else {
      std::fprintf(stderr, "usage: %s [--device SELECTOR] [--reps N] [--no-timing] [--all-storages] [--decode-shapes]\n",
                   argv[0]);
      return arg == "--help" || arg == "-h" ? 0 : 2;
    }
  }
  return inferd::opencl::run(options);
}
