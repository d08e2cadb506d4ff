// The OpenCL backend's registration (backend_factory.h). Device: a decimal index into every platform's
// devices (Runtime::create_default). Settings, each also read from the worker's environment:
//   storage      INFERD_OPENCL_STORAGE      buffer | image_buffer | texture2d | texture3d | texture2d_split
//                                           (default: storage_choice decides)
//   storage_choice  INFERD_OPENCL_STORAGE_CHOICE  measure | rule (default: measure on GPUs and accelerators,
//                                           rule on CPU devices; cl_backend.h, StoragePolicy)
//   activations  INFERD_OPENCL_ACTIVATIONS  f32 | f16 (default: f16 with float numerics on a device with
//                                           cl_khr_fp16)
//   numerics     INFERD_OPENCL_NUMERICS     exact | float (default: exact where the device has cl_khr_fp64)
//   int_dot      INFERD_OPENCL_INT_DOT      float | int8 (default: int8 where the device has
//                                           cl_khr_integer_dot_product)
//   decode_shape INFERD_OPENCL_DECODE_SHAPE RxU, the float decode matmul's work-group shape (ops.h DecodeShape;
//                                           default: timed where storage_choice is measure, else per device)
//   fuse         INFERD_OPENCL_FUSE         on | off (default on: the residual added in the matmul's store,
//                                           SwiGLU in the float decode's gate|up matmul)
//   prefill_tokens INFERD_OPENCL_PREFILL_TOKENS  1..16, the float prefill matmul's tokens per work-item
//                                           (default: 16 on CPU devices, 4 elsewhere)
//   prefill      INFERD_OPENCL_PREFILL      simple | tiled, the float prefill matmul's kernel (default: simple)
//   replay       INFERD_OPENCL_REPLAY       on | off (default on: a decode step's launches recorded once per
//                                           shape and enqueued again as recorded)
//   attention_chunk INFERD_OPENCL_ATTENTION_CHUNK  0..65536, positions per chunk of the float attention split
//                                           over the positions (0: never split; default: 64 on GPUs, 0 on CPUs)
// A value outside these lists is kInvalidArgument naming the setting and its variable. The program
// binary cache is default_cache_dir() ($XDG_CACHE_HOME or $HOME).
#include <algorithm>
#include <optional>
#include <string_view>

#include "inferd/backend_factory.h"
#include "inferd/opencl/cl_backend.h"

namespace inferd {

namespace {

using namespace opencl;

const std::map<std::string, std::string> kEnvironment = {{"storage", "INFERD_OPENCL_STORAGE"},
                                                         {"storage_choice", "INFERD_OPENCL_STORAGE_CHOICE"},
                                                         {"activations", "INFERD_OPENCL_ACTIVATIONS"},
                                                         {"numerics", "INFERD_OPENCL_NUMERICS"},
                                                         {"int_dot", "INFERD_OPENCL_INT_DOT"},
                                                         {"decode_shape", "INFERD_OPENCL_DECODE_SHAPE"},
                                                         {"fuse", "INFERD_OPENCL_FUSE"},
                                                         {"prefill_tokens", "INFERD_OPENCL_PREFILL_TOKENS"},
                                                         {"prefill", "INFERD_OPENCL_PREFILL"},
                                                         {"attention_chunk", "INFERD_OPENCL_ATTENTION_CHUNK"},
                                                         {"replay", "INFERD_OPENCL_REPLAY"}};
constexpr IntDot kIntDots[] = {IntDot::kFloat, IntDot::kInt8};
constexpr Numerics kNumerics[] = {Numerics::kExact, Numerics::kFloat};
constexpr StoragePolicy kStoragePolicies[] = {StoragePolicy::kMeasure, StoragePolicy::kRule};
constexpr PrefillKernel kPrefillKernels[] = {PrefillKernel::kSimple, PrefillKernel::kTiled};

// Setting `key` among `choices` (named by `name_of`); unset when absent, kInvalidArgument naming the
// setting, its variable and the choices otherwise.
template <typename T, size_t N, typename NameOf>
Result<std::optional<T>> choice(const BackendConfig& config, const std::string& key, const T (&choices)[N],
                                NameOf name_of) {
  auto it = config.settings.find(key);
  if (it == config.settings.end()) return std::optional<T>();
  std::string expected;
  for (const T& c : choices) {
    if (it->second == name_of(c)) return std::optional<T>(c);
    expected += std::string(expected.empty() ? "" : ", ") + name_of(c);
  }
  return Status(Code::kInvalidArgument, kEnvironment.at(key) + " (" + key + ") = '" + it->second +
                                            "': expected one of " + expected);
}

constexpr bool kOnOff[] = {true, false};
const char* on_off_name(bool on) { return on ? "on" : "off"; }

// Setting `key` as a decimal integer in [lo, hi] (at most hi's digits); unset when absent,
// kInvalidArgument naming the setting, its variable and the range otherwise.
Result<std::optional<int>> integer(const BackendConfig& config, const std::string& key, int lo, int hi) {
  auto it = config.settings.find(key);
  if (it == config.settings.end()) return std::optional<int>();
  const std::string& v = it->second;
  const bool digits = !v.empty() && v.size() <= std::to_string(hi).size() &&
                      std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
  const int n = digits ? std::stoi(v) : lo - 1;
  if (n < lo || n > hi) {
    return Status(Code::kInvalidArgument, kEnvironment.at(key) + " (" + key + ") = '" + v + "': expected " +
                                              std::to_string(lo) + " to " + std::to_string(hi));
  }
  return std::optional<int>(n);
}

Result<std::unique_ptr<Backend>> create(const BackendConfig& config) {
  for (const auto& [key, value] : config.settings) {
    if (!kEnvironment.count(key)) return Status(Code::kInvalidArgument, "the OpenCL backend has no setting '" + key + "'");
  }
  OpenClOptions o;
  auto storage = choice(config, "storage", kAllStorageTypes, storage_name);
  if (!storage) return storage.status();
  auto policy = choice(config, "storage_choice", kStoragePolicies, storage_policy_name);
  if (!policy) return policy.status();
  auto data_type = choice(config, "activations", kAllDataTypes, data_type_name);
  if (!data_type) return data_type.status();
  auto numerics = choice(config, "numerics", kNumerics, numerics_name);
  if (!numerics) return numerics.status();
  auto int_dot = choice(config, "int_dot", kIntDots, int_dot_name);
  if (!int_dot) return int_dot.status();
  auto prefill = choice(config, "prefill", kPrefillKernels, prefill_kernel_name);
  if (!prefill) return prefill.status();
  o.prefill_kernel = prefill.value();
  o.activation_storage = storage.value();
  o.storage_policy = policy.value();
  o.activation_type = data_type.value();
  if (numerics.value()) o.numerics = *numerics.value();
  o.int_dot = int_dot.value();
  auto fuse = choice(config, "fuse", kOnOff, on_off_name);
  if (!fuse) return fuse.status();
  o.fuse = fuse.value().value_or(o.fuse);
  auto replay = choice(config, "replay", kOnOff, on_off_name);
  if (!replay) return replay.status();
  o.replay = replay.value().value_or(o.replay);
  auto prefill_tokens = integer(config, "prefill_tokens", 1, kMaxPrefillTokens);
  if (!prefill_tokens) return prefill_tokens.status();
  o.prefill_tokens = prefill_tokens.value();
  auto attention_chunk = integer(config, "attention_chunk", 0, kMaxAttentionChunkOption);
  if (!attention_chunk) return attention_chunk.status();
  o.attention_chunk = attention_chunk.value();
  if (auto it = config.settings.find("decode_shape"); it != config.settings.end()) {
    auto shape = parse_decode_shape(it->second);
    if (!shape) return shape.status().with_context(kEnvironment.at("decode_shape") + " (decode_shape)");
    o.decode_shape = shape.value();
  }
  RuntimeOptions ro;
  ro.cache_dir = default_cache_dir();
  auto runtime = Runtime::create_default(ro, config.device);
  if (!runtime) return runtime.status();
  auto b = OpenClBackend::create(std::move(runtime).value(), o);
  if (!b) return b.status();
  return std::unique_ptr<Backend>(std::move(b).value());
}

// The backend-ops suite's configurations: both numerics, every activation storage, halves, the int8 dots.
std::vector<BackendVariant> variants() {
  std::vector<BackendVariant> v;
  auto add = [&](std::string name, std::map<std::string, std::string> settings, bool storage_only = false) {
    v.push_back({std::move(name), BackendConfig{"", 0, std::move(settings)}, storage_only});
  };
  for (StorageType s : kAllStorageTypes) {
    add(std::string("opencl_exact_") + storage_name(s), {{"storage", storage_name(s)}}, s != StorageType::kBuffer);
  }
  add("opencl_exact_int8", {{"int_dot", "int8"}, {"storage", "buffer"}});
  add("opencl_float_buffer", {{"numerics", "float"}, {"activations", "f32"}, {"storage", "buffer"}});
  add("opencl_float_texture2d", {{"numerics", "float"}, {"activations", "f32"}, {"storage", "texture2d"}}, true);
  add("opencl_float_f16", {{"numerics", "float"}, {"activations", "f16"}, {"storage", "buffer"}});
  return v;
}

}  // namespace

const BackendFactory& opencl_backend_factory() {
  static const BackendFactory factory{"opencl", create, kEnvironment, variants};
  return factory;
}

}  // namespace inferd
