// inferd/opencl/cl_runtime.h — OpenCL devices, contexts, queues and programs (issue 5).
//
// The runtime under the OpenCL backend: it enumerates devices and queries what each can do once, at
// start (DeviceInfo), so that storage choice, code generation and kernel variants can specialise on
// it (ML Drift's device specialisation); it owns one context and one in-order command queue for one
// device, created at LOW priority where the device has cl_khr_priority_hints (Transformer-Lite 2.2:
// inference must not starve the compositor); and it builds programs through two caches: an in-memory
// one (a program is built once per Runtime) and an optional on-disk cache of program binaries keyed by
// (device name, driver version, source hash, build options).
//
// Errors: every OpenCL failure becomes a Status whose message names the call and the error code
// ("clBuildProgram: CL_BUILD_PROGRAM_FAILURE (-11)"); a program that does not build returns its full
// build log. "No OpenCL platform or device" is kNotFound, never a crash. A corrupt or stale cache
// entry is rebuilt from source, never fatal.
//
// Thread safety: free functions are thread-safe. A Runtime is used by one thread at a time (the
// worker's compute thread); the OpenCL objects it hands out may be used from other threads as the
// OpenCL specification allows (everything but cl_kernel). ProgramBinaryCache instances are
// independent; concurrent writers of one entry are safe (each writes its own temporary file and
// renames it into place, and readers validate what they read).
#pragma once

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300
#endif
#include <CL/cl.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "inferd/status.h"

namespace inferd::opencl {

// ---- Errors ------------------------------------------------------------------------------------

// "CL_OUT_OF_RESOURCES" for -5; "CL_UNKNOWN_ERROR" for a code this table does not know.
const char* cl_error_name(cl_int code);

// A Status for a failed OpenCL call: "<what>: <NAME> (<code>)". kNotFound for CL_DEVICE_NOT_FOUND and
// CL_PLATFORM_NOT_FOUND_KHR, kFailed otherwise. Asserts that `code` is not CL_SUCCESS.
Status cl_error(cl_int code, std::string_view what);

// Returns cl_error(...) naming the statement, file and line when `call` does not return CL_SUCCESS.
#define INFERD_CL_RETURN_IF_ERROR(call)                                                       \
  do {                                                                                        \
    const cl_int inferd_cl_err_ = (call);                                                     \
    if (inferd_cl_err_ != CL_SUCCESS)                                                         \
      return ::inferd::opencl::cl_error(inferd_cl_err_, ::inferd::opencl::detail::call_site( \
                                                            #call, __FILE__, __LINE__));      \
  } while (0)

namespace detail {
std::string call_site(const char* statement, const char* file, int line);

// Owns one reference to an OpenCL object; move-only.
template <typename T, cl_int(CL_API_CALL* kRelease)(T)>
class ClHandle {
 public:
  ClHandle() = default;
  explicit ClHandle(T handle) : handle_(handle) {}
  ~ClHandle() { reset(); }
  ClHandle(ClHandle&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  ClHandle& operator=(ClHandle&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  ClHandle(const ClHandle&) = delete;
  ClHandle& operator=(const ClHandle&) = delete;

  T get() const { return handle_; }
  explicit operator bool() const { return handle_ != nullptr; }
  void reset(T handle = nullptr) {
    if (handle_ != nullptr) kRelease(handle_);
    handle_ = handle;
  }

 private:
  T handle_ = nullptr;
};
}  // namespace detail

using ClContext = detail::ClHandle<cl_context, clReleaseContext>;
using ClQueue = detail::ClHandle<cl_command_queue, clReleaseCommandQueue>;
using ClProgram = detail::ClHandle<cl_program, clReleaseProgram>;
using ClKernel = detail::ClHandle<cl_kernel, clReleaseKernel>;
using ClMem = detail::ClHandle<cl_mem, clReleaseMemObject>;
using ClEvent = detail::ClHandle<cl_event, clReleaseEvent>;

// ---- Devices -----------------------------------------------------------------------------------

enum class DeviceType { kGpu, kCpu, kAccelerator, kOther };
const char* device_type_name(DeviceType type);

// What one device can do, queried once. Sizes in bytes unless named otherwise; image sizes in pixels.
struct DeviceInfo {
  std::string platform_name;
  std::string platform_version;
  std::string vendor;
  std::string name;
  std::string driver_version;
  std::string device_version;    // "OpenCL 3.0 PoCL ..."
  std::string opencl_c_version;  // "OpenCL C 1.2 PoCL"
  int version_major = 0, version_minor = 0;  // parsed from device_version
  int c_version_major = 0, c_version_minor = 0;  // parsed from opencl_c_version
  DeviceType type = DeviceType::kOther;
  std::vector<std::string> extensions;  // sorted

  uint32_t compute_units = 0;
  uint32_t max_clock_mhz = 0;
  size_t max_work_group_size = 0;
  size_t max_work_item_sizes[3] = {0, 0, 0};
  uint64_t local_mem_bytes = 0;
  uint64_t global_mem_bytes = 0;
  uint64_t max_alloc_bytes = 0;
  uint32_t mem_base_addr_align_bytes = 0;  // sub-buffer origins must be multiples of this

  bool fp16 = false;                 // cl_khr_fp16: half arithmetic
  bool fp64 = false;                 // cl_khr_fp64
  bool fp32_correct_div_sqrt = false;  // CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT: the build option is allowed
  bool integer_dot_product = false;  // cl_khr_integer_dot_product
  uint32_t integer_dot_product_caps = 0;  // CL_DEVICE_INTEGER_DOT_PRODUCT_CAPABILITIES_KHR bits
  bool subgroups = false;            // cl_khr_subgroups, cl_intel_subgroups or OpenCL 3.0 sub-groups
  std::vector<size_t> subgroup_sizes;  // from cl_intel_required_subgroup_size; empty when unknown

  bool image_support = false;
  size_t image2d_max_width = 0, image2d_max_height = 0;
  size_t image3d_max_width = 0, image3d_max_height = 0, image3d_max_depth = 0;
  size_t image_max_buffer_size = 0;  // pixels of an image1d_buffer
  size_t image_max_array_size = 0;
  uint32_t image_pitch_alignment = 0;  // pixels; 0 when not reported

  bool priority_hints = false;  // cl_khr_priority_hints
  // Vendor matrix-multiply and packed-dot extensions found by name (cl_intel_subgroup_matrix_multiply_
  // accumulate, cl_qcom_*, cl_arm_*_int8, ...): the candidates for specialised kernel variants.
  std::vector<std::string> matrix_extensions;

  bool has_extension(std::string_view extension) const;
  // A multi-line human-readable description (inferd-opencl-info).
  std::string to_string() const;
};

// Extracts (major, minor) from "OpenCL 3.0 ..." or "OpenCL C 1.2 ..."; {0, 0} when malformed.
std::pair<int, int> parse_opencl_version(std::string_view text);
// Whether an extension name is a vendor matrix-multiply / packed-dot extension (see DeviceInfo).
bool is_matrix_extension(std::string_view extension);

struct DeviceHandle {
  cl_platform_id platform = nullptr;
  cl_device_id device = nullptr;
  DeviceInfo info;
};

// Every device of every platform, in platform order. kNotFound when there is no platform or device
// (no ICD installed, no driver); kFailed when a query fails.
Result<std::vector<DeviceHandle>> list_devices();

// Picks one of list_devices(): "" picks the first GPU, else the first device; a decimal number picks
// by index; anything else picks the first device whose name contains it (case-sensitive).
// kNotFound when nothing matches.
Result<DeviceHandle> select_device(std::string_view selector);

// Queries one device (list_devices() does this for every device).
Result<DeviceInfo> query_device_info(cl_platform_id platform, cl_device_id device);

// ---- Program binary cache -----------------------------------------------------------------------

// 64-bit FNV-1a (the source hash of a cache key; not a cryptographic hash: the cache is a
// per-user directory, and every entry stores and checks its whole key).
uint64_t fnv1a64(std::string_view data, uint64_t seed = 14695981039346656037ull);

struct ProgramKey {
  std::string device_name;
  std::string driver_version;
  uint64_t source_hash = 0;
  std::string options;

  // The full key as stored in an entry: one field per line.
  std::string canonical() const;
  // "<16 hex digits of fnv1a64(canonical())>.clbin".
  std::string file_name() const;
};

// An on-disk cache of program binaries in one directory.
//
// Entry format (little-endian, version 1):
//   0  char[8] magic "INFDCLB1"
//   8  u32     format version (1)
//   12 u32     key length K
//   16 u64     binary length N
//   24 u64     fnv1a64 of key bytes then binary bytes
//   32 K bytes canonical key, then N bytes the binary as clGetProgramInfo(CL_PROGRAM_BINARIES) gave it
// The file's size must be exactly 32 + K + N. Entries are written to "<name>.tmp.<pid>.<n>" and
// renamed into place, so readers see either nothing or a whole entry.
class ProgramBinaryCache {
 public:
  explicit ProgramBinaryCache(std::string directory) : directory_(std::move(directory)) {}

  const std::string& directory() const { return directory_; }
  std::string path_for(const ProgramKey& key) const;

  // The binary stored for `key`: kNotFound when there is no entry; kCorrupt when the entry is
  // truncated, has a bad magic/version/checksum or another key (the caller rebuilds and stores).
  Result<std::vector<unsigned char>> load(const ProgramKey& key) const;
  // Writes an entry atomically, creating the directory. kFailed on I/O errors.
  Status store(const ProgramKey& key, const std::vector<unsigned char>& binary) const;

 private:
  std::string directory_;
};

// $XDG_CACHE_HOME/inferd/opencl, else $HOME/.cache/inferd/opencl; "" when neither variable is set.
std::string default_cache_dir();

// The files of the caches in that directory (program binaries, storage records: storage_record.h).
// Writes `data` to `path` so that readers see the old file or the whole new one: a temporary file in the
// same directory, fsync, rename; creates the directory. kFailed on I/O errors.
Status write_file_atomically(const std::string& path, std::span<const unsigned char> data);
// A whole file; kNotFound when it does not exist, kFailed when it cannot be read.
Result<std::vector<unsigned char>> read_whole_file(const std::string& path);

// ---- Runtime -----------------------------------------------------------------------------------

enum class QueuePriority { kDefault, kLow, kMedium, kHigh };

// Whether a transfer returns when it is done (kWait) or as soon as it is queued (kEnqueue).
enum class Transfer : uint8_t { kWait, kEnqueue };
const char* queue_priority_name(QueuePriority priority);

struct RuntimeOptions {
  // Applied only where the device has cl_khr_priority_hints; elsewhere the queue has no priority.
  QueuePriority priority = QueuePriority::kLow;
  bool profiling = false;  // CL_QUEUE_PROFILING_ENABLE
  // Directory of the program binary cache; "" disables it. See default_cache_dir().
  std::string cache_dir;
};

struct ProgramCacheStats {
  int memory_hits = 0;     // build_program() found the program already built by this Runtime
  int disk_hits = 0;       // loaded from a valid cache entry
  int disk_rejected = 0;   // an entry existed but was corrupt or did not load: rebuilt from source
  int compiled = 0;        // built from source
  int store_failures = 0;  // the binary could not be written (not fatal)
};

class Runtime {
 public:
  // A context and an in-order queue on `device`.
  static Result<std::unique_ptr<Runtime>> create(const DeviceHandle& device, RuntimeOptions options = {});
  // create(select_device(selector)).
  static Result<std::unique_ptr<Runtime>> create_default(RuntimeOptions options = {},
                                                         std::string_view selector = "");

  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const DeviceInfo& info() const { return device_.info; }
  cl_device_id device() const { return device_.device; }
  cl_context context() const { return context_.get(); }
  cl_command_queue queue() const { return queue_.get(); }
  // The priority the queue really has: options.priority with priority hints, else kDefault.
  QueuePriority queue_priority() const { return priority_; }
  const RuntimeOptions& options() const { return options_; }

  // The program for (source, options), built for this device. Owned by the Runtime: valid until it
  // is destroyed. kFailed with the complete build log when the source does not build.
  Result<cl_program> build_program(std::string_view source, std::string_view options);
  // build_program() for several sources at once: those not built yet are loaded or compiled side by side in
  // up to max_threads threads (0: one per hardware thread), as a cold start of a model does with its
  // kernels. One result per source, in order.
  std::vector<Result<cl_program>> build_programs(std::span<const std::string> sources, std::string_view options,
                                                 int max_threads = 0);
  const ProgramCacheStats& cache_stats() const { return stats_; }
  // Forgets the programs built so far (tests of the disk cache); invalidates their cl_programs.
  void clear_memory_cache() { programs_.clear(); }

  // A buffer of `bytes` bytes, initialised from `host` when it is non-null.
  Result<ClMem> create_buffer(size_t bytes, cl_mem_flags flags = CL_MEM_READ_WRITE, const void* host = nullptr);
  // Transfers between device memory and host memory. kWait returns when the transfer is done (a host
  // wait: the in-order queue runs everything before it first); kEnqueue returns at once, and `host` must
  // stay valid and unchanged until the queue has run the transfer (the next host wait).
  Status write_buffer(cl_mem buffer, size_t offset, size_t bytes, const void* host, Transfer how = Transfer::kWait);
  Status read_buffer(cl_mem buffer, size_t offset, size_t bytes, void* host, Transfer how = Transfer::kWait);
  // A box of an image: origin and region in pixels, row_pitch in bytes, slice_pitch 0 for a 2D image.
  Status write_image(cl_mem image, const size_t (&origin)[3], const size_t (&region)[3], size_t row_pitch,
                     size_t slice_pitch, const void* host, Transfer how = Transfer::kWait);
  Status read_image(cl_mem image, const size_t (&origin)[3], const size_t (&region)[3], size_t row_pitch,
                    size_t slice_pitch, void* host, Transfer how = Transfer::kWait);
  // Waits until every queued command has finished.
  Status finish();
  // How many times the host has waited for the queue (kWait transfers and finish()): each is a round
  // trip to the device, which a step of the backend makes once (OpenClBackend::compute).
  int64_t host_waits() const { return host_waits_; }

 private:
  Runtime(DeviceHandle device, RuntimeOptions options) : device_(std::move(device)), options_(std::move(options)) {}
  // CL_TRUE for kWait, counted as a host wait.
  cl_bool blocking(Transfer how) {
    host_waits_ += how == Transfer::kWait;
    return how == Transfer::kWait ? CL_TRUE : CL_FALSE;
  }
  Result<ClProgram> load_or_compile(std::string_view source, const std::string& options, ProgramCacheStats& stats) const;
  Result<ClProgram> build_from_source(std::string_view source, const std::string& options) const;
  Result<ClProgram> build_from_binary(const std::vector<unsigned char>& binary, const std::string& options) const;

  DeviceHandle device_;
  RuntimeOptions options_;
  QueuePriority priority_ = QueuePriority::kDefault;
  ClContext context_;
  ClQueue queue_;
  std::map<std::string, ClProgram> programs_;  // by canonical ProgramKey
  ProgramCacheStats stats_;
  int64_t host_waits_ = 0;
};

}  // namespace inferd::opencl
