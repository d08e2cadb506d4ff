// The OpenCL runtime: error names, device queries, queues, program builds and the binary cache.
// clCreateCommandQueue is deprecated since OpenCL 2.0 but is the only way to make a queue on a 1.x
// device, so its declaration is requested here (and only here).
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include "inferd/opencl/cl_runtime.h"

#include <CL/cl_ext.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>

namespace inferd::opencl {

// ---- Errors ------------------------------------------------------------------------------------

const char* cl_error_name(cl_int code) {
  switch (code) {
#define INFERD_CL_ERROR_CASE(name) \
  case name: return #name;
    INFERD_CL_ERROR_CASE(CL_SUCCESS)
    INFERD_CL_ERROR_CASE(CL_DEVICE_NOT_FOUND)
    INFERD_CL_ERROR_CASE(CL_DEVICE_NOT_AVAILABLE)
    INFERD_CL_ERROR_CASE(CL_COMPILER_NOT_AVAILABLE)
    INFERD_CL_ERROR_CASE(CL_MEM_OBJECT_ALLOCATION_FAILURE)
    INFERD_CL_ERROR_CASE(CL_OUT_OF_RESOURCES)
    INFERD_CL_ERROR_CASE(CL_OUT_OF_HOST_MEMORY)
    INFERD_CL_ERROR_CASE(CL_PROFILING_INFO_NOT_AVAILABLE)
    INFERD_CL_ERROR_CASE(CL_MEM_COPY_OVERLAP)
    INFERD_CL_ERROR_CASE(CL_IMAGE_FORMAT_MISMATCH)
    INFERD_CL_ERROR_CASE(CL_IMAGE_FORMAT_NOT_SUPPORTED)
    INFERD_CL_ERROR_CASE(CL_BUILD_PROGRAM_FAILURE)
    INFERD_CL_ERROR_CASE(CL_MAP_FAILURE)
    INFERD_CL_ERROR_CASE(CL_MISALIGNED_SUB_BUFFER_OFFSET)
    INFERD_CL_ERROR_CASE(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
    INFERD_CL_ERROR_CASE(CL_COMPILE_PROGRAM_FAILURE)
    INFERD_CL_ERROR_CASE(CL_LINKER_NOT_AVAILABLE)
    INFERD_CL_ERROR_CASE(CL_LINK_PROGRAM_FAILURE)
    INFERD_CL_ERROR_CASE(CL_DEVICE_PARTITION_FAILED)
    INFERD_CL_ERROR_CASE(CL_KERNEL_ARG_INFO_NOT_AVAILABLE)
    INFERD_CL_ERROR_CASE(CL_INVALID_VALUE)
    INFERD_CL_ERROR_CASE(CL_INVALID_DEVICE_TYPE)
    INFERD_CL_ERROR_CASE(CL_INVALID_PLATFORM)
    INFERD_CL_ERROR_CASE(CL_INVALID_DEVICE)
    INFERD_CL_ERROR_CASE(CL_INVALID_CONTEXT)
    INFERD_CL_ERROR_CASE(CL_INVALID_QUEUE_PROPERTIES)
    INFERD_CL_ERROR_CASE(CL_INVALID_COMMAND_QUEUE)
    INFERD_CL_ERROR_CASE(CL_INVALID_HOST_PTR)
    INFERD_CL_ERROR_CASE(CL_INVALID_MEM_OBJECT)
    INFERD_CL_ERROR_CASE(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR)
    INFERD_CL_ERROR_CASE(CL_INVALID_IMAGE_SIZE)
    INFERD_CL_ERROR_CASE(CL_INVALID_SAMPLER)
    INFERD_CL_ERROR_CASE(CL_INVALID_BINARY)
    INFERD_CL_ERROR_CASE(CL_INVALID_BUILD_OPTIONS)
    INFERD_CL_ERROR_CASE(CL_INVALID_PROGRAM)
    INFERD_CL_ERROR_CASE(CL_INVALID_PROGRAM_EXECUTABLE)
    INFERD_CL_ERROR_CASE(CL_INVALID_KERNEL_NAME)
    INFERD_CL_ERROR_CASE(CL_INVALID_KERNEL_DEFINITION)
    INFERD_CL_ERROR_CASE(CL_INVALID_KERNEL)
    INFERD_CL_ERROR_CASE(CL_INVALID_ARG_INDEX)
    INFERD_CL_ERROR_CASE(CL_INVALID_ARG_VALUE)
    INFERD_CL_ERROR_CASE(CL_INVALID_ARG_SIZE)
    INFERD_CL_ERROR_CASE(CL_INVALID_KERNEL_ARGS)
    INFERD_CL_ERROR_CASE(CL_INVALID_WORK_DIMENSION)
    INFERD_CL_ERROR_CASE(CL_INVALID_WORK_GROUP_SIZE)
    INFERD_CL_ERROR_CASE(CL_INVALID_WORK_ITEM_SIZE)
    INFERD_CL_ERROR_CASE(CL_INVALID_GLOBAL_OFFSET)
    INFERD_CL_ERROR_CASE(CL_INVALID_EVENT_WAIT_LIST)
    INFERD_CL_ERROR_CASE(CL_INVALID_EVENT)
    INFERD_CL_ERROR_CASE(CL_INVALID_OPERATION)
    INFERD_CL_ERROR_CASE(CL_INVALID_GL_OBJECT)
    INFERD_CL_ERROR_CASE(CL_INVALID_BUFFER_SIZE)
    INFERD_CL_ERROR_CASE(CL_INVALID_MIP_LEVEL)
    INFERD_CL_ERROR_CASE(CL_INVALID_GLOBAL_WORK_SIZE)
    INFERD_CL_ERROR_CASE(CL_INVALID_PROPERTY)
    INFERD_CL_ERROR_CASE(CL_INVALID_IMAGE_DESCRIPTOR)
    INFERD_CL_ERROR_CASE(CL_INVALID_COMPILER_OPTIONS)
    INFERD_CL_ERROR_CASE(CL_INVALID_LINKER_OPTIONS)
    INFERD_CL_ERROR_CASE(CL_INVALID_DEVICE_PARTITION_COUNT)
    INFERD_CL_ERROR_CASE(CL_INVALID_PIPE_SIZE)
    INFERD_CL_ERROR_CASE(CL_INVALID_DEVICE_QUEUE)
    INFERD_CL_ERROR_CASE(CL_INVALID_SPEC_ID)
    INFERD_CL_ERROR_CASE(CL_MAX_SIZE_RESTRICTION_EXCEEDED)
    INFERD_CL_ERROR_CASE(CL_PLATFORM_NOT_FOUND_KHR)
#undef INFERD_CL_ERROR_CASE
    default: return "CL_UNKNOWN_ERROR";
  }
}

Status cl_error(cl_int code, std::string_view what) {
  INFERD_ASSERT(code != CL_SUCCESS, "cl_error() called for a successful call");
  const Code kind = (code == CL_DEVICE_NOT_FOUND || code == CL_PLATFORM_NOT_FOUND_KHR) ? Code::kNotFound : Code::kFailed;
  return Status(kind, std::string(what) + ": " + cl_error_name(code) + " (" + std::to_string(code) + ")");
}

namespace detail {
std::string call_site(const char* statement, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  std::string call(statement);
  const size_t paren = call.find('(');
  if (paren != std::string::npos) call.resize(paren);  // the function's name is enough
  return call + " at " + (base ? base + 1 : file) + ":" + std::to_string(line);
}
}  // namespace detail

namespace {

// ---- Query helpers -------------------------------------------------------------------------------

Result<std::string> platform_string(cl_platform_id platform, cl_platform_info param) {
  size_t size = 0;
  INFERD_CL_RETURN_IF_ERROR(clGetPlatformInfo(platform, param, 0, nullptr, &size));
  std::string value(size, '\0');
  INFERD_CL_RETURN_IF_ERROR(clGetPlatformInfo(platform, param, size, value.data(), nullptr));
  while (!value.empty() && value.back() == '\0') value.pop_back();
  return value;
}

Result<std::string> device_string(cl_device_id device, cl_device_info param) {
  size_t size = 0;
  INFERD_CL_RETURN_IF_ERROR(clGetDeviceInfo(device, param, 0, nullptr, &size));
  std::string value(size, '\0');
  INFERD_CL_RETURN_IF_ERROR(clGetDeviceInfo(device, param, size, value.data(), nullptr));
  while (!value.empty() && value.back() == '\0') value.pop_back();
  return value;
}

template <typename T>
Status device_value(cl_device_id device, cl_device_info param, T* out) {
  INFERD_CL_RETURN_IF_ERROR(clGetDeviceInfo(device, param, sizeof(T), out, nullptr));
  return Status::ok();
}

// An optional property: left unchanged when the device does not report it.
template <typename T>
void optional_device_value(cl_device_id device, cl_device_info param, T* out) {
  T value{};
  if (clGetDeviceInfo(device, param, sizeof(T), &value, nullptr) == CL_SUCCESS) *out = value;
}

std::vector<std::string> split_words(std::string_view text) {
  std::vector<std::string> words;
  std::istringstream in{std::string(text)};
  std::string word;
  while (in >> word) words.push_back(word);
  return words;
}

}  // namespace

// ---- Devices -----------------------------------------------------------------------------------

const char* device_type_name(DeviceType type) {
  switch (type) {
    case DeviceType::kGpu: return "GPU";
    case DeviceType::kCpu: return "CPU";
    case DeviceType::kAccelerator: return "accelerator";
    case DeviceType::kOther: return "other";
  }
  return "?";
}

std::pair<int, int> parse_opencl_version(std::string_view text) {
  constexpr std::string_view kPrefixC = "OpenCL C ", kPrefix = "OpenCL ";
  if (text.substr(0, kPrefixC.size()) == kPrefixC) {
    text.remove_prefix(kPrefixC.size());
  } else if (text.substr(0, kPrefix.size()) == kPrefix) {
    text.remove_prefix(kPrefix.size());
  } else {
    return {0, 0};
  }
  int major = 0, minor = 0;
  if (std::sscanf(std::string(text).c_str(), "%d.%d", &major, &minor) != 2 || major < 0 || minor < 0) return {0, 0};
  return {major, minor};
}

bool is_matrix_extension(std::string_view ext) {
  // Exact names of known matrix / packed-dot extensions, then whole vendor families.
  static constexpr std::string_view kNames[] = {
      "cl_intel_subgroup_matrix_multiply_accumulate",
      "cl_intel_subgroup_split_matrix_multiply_accumulate",
      "cl_intel_subgroup_matrix_multiply_accumulate_tf32",
      "cl_arm_matrix_multiply",
      "cl_arm_integer_dot_product_int8",
      "cl_arm_integer_dot_product_accumulate_int8",
      "cl_arm_integer_dot_product_accumulate_int16",
      "cl_arm_integer_dot_product_accumulate_saturate_int8",
      "cl_amd_media_ops2",
      "cl_nv_mma",
  };
  for (std::string_view name : kNames) {
    if (ext == name) return true;
  }
  // Qualcomm exposes its tensor and dot-product paths as many cl_qcom_* extensions
  // (cl_qcom_dot_product8, cl_qcom_ml_ops, cl_qcom_recordable_queues, ...): all of them are listed so
  // that a kernel author sees what an Adreno offers.
  return ext.substr(0, 8) == "cl_qcom_";
}

bool DeviceInfo::has_extension(std::string_view extension) const {
  return std::binary_search(extensions.begin(), extensions.end(), extension,
                            [](std::string_view a, std::string_view b) { return a < b; });
}

std::string DeviceInfo::to_string() const {
  std::ostringstream out;
  auto yes_no = [](bool v) { return v ? "yes" : "no"; };
  out << name << " (" << device_type_name(type) << ", " << vendor << ")\n";
  out << "  platform:        " << platform_name << " — " << platform_version << "\n";
  out << "  version:         " << device_version << "; " << opencl_c_version << "; driver " << driver_version
      << "\n";
  out << "  compute units:   " << compute_units << " @ " << max_clock_mhz << " MHz\n";
  out << "  work-group:      max " << max_work_group_size << " (" << max_work_item_sizes[0] << " x "
      << max_work_item_sizes[1] << " x " << max_work_item_sizes[2] << ")\n";
  out << "  memory:          global " << (global_mem_bytes >> 20) << " MiB, max alloc " << (max_alloc_bytes >> 20)
      << " MiB, local " << (local_mem_bytes >> 10) << " KiB, base align " << mem_base_addr_align_bytes << " B\n";
  out << "  fp16:            " << yes_no(fp16) << "   fp64: " << yes_no(fp64)
      << "   correctly rounded float divide/sqrt: " << yes_no(fp32_correct_div_sqrt) << "\n";
  out << "  int dot product: " << yes_no(integer_dot_product);
  if (integer_dot_product) out << " (caps 0x" << std::hex << integer_dot_product_caps << std::dec << ")";
  out << "\n  subgroups:       " << yes_no(subgroups);
  if (!subgroup_sizes.empty()) {
    out << " (sizes";
    for (size_t s : subgroup_sizes) out << " " << s;
    out << ")";
  }
  out << "\n  images:          " << yes_no(image_support);
  if (image_support) {
    out << " (2D " << image2d_max_width << " x " << image2d_max_height << ", 3D " << image3d_max_width << " x "
        << image3d_max_height << " x " << image3d_max_depth << ", buffer " << image_max_buffer_size << " px, array "
        << image_max_array_size << ")";
  }
  out << "\n  priority hints:  " << yes_no(priority_hints) << "\n";
  out << "  matrix exts:     ";
  if (matrix_extensions.empty()) out << "none";
  for (size_t i = 0; i < matrix_extensions.size(); ++i) out << (i ? ", " : "") << matrix_extensions[i];
  out << "\n  extensions:      " << extensions.size() << ":";
  for (const std::string& e : extensions) out << " " << e;
  out << "\n";
  return out.str();
}

Result<DeviceInfo> query_device_info(cl_platform_id platform, cl_device_id device) {
  DeviceInfo info;
  {
    auto r = platform_string(platform, CL_PLATFORM_NAME);
    if (!r) return r.status();
    info.platform_name = std::move(r.value());
    auto v = platform_string(platform, CL_PLATFORM_VERSION);
    if (!v) return v.status();
    info.platform_version = std::move(v.value());
  }
  struct StringField {
    cl_device_info param;
    std::string* out;
  };
  const StringField strings[] = {
      {CL_DEVICE_VENDOR, &info.vendor},
      {CL_DEVICE_NAME, &info.name},
      {CL_DRIVER_VERSION, &info.driver_version},
      {CL_DEVICE_VERSION, &info.device_version},
      {CL_DEVICE_OPENCL_C_VERSION, &info.opencl_c_version},
  };
  for (const StringField& field : strings) {
    auto r = device_string(device, field.param);
    if (!r) return r.status();
    *field.out = std::move(r.value());
  }
  std::tie(info.version_major, info.version_minor) = parse_opencl_version(info.device_version);
  std::tie(info.c_version_major, info.c_version_minor) = parse_opencl_version(info.opencl_c_version);

  auto ext = device_string(device, CL_DEVICE_EXTENSIONS);
  if (!ext) return ext.status();
  info.extensions = split_words(ext.value());
  std::sort(info.extensions.begin(), info.extensions.end());
  info.extensions.erase(std::unique(info.extensions.begin(), info.extensions.end()), info.extensions.end());

  cl_device_type type = 0;
  INFERD_RETURN_IF_ERROR(device_value(device, CL_DEVICE_TYPE, &type));
  info.type = (type & CL_DEVICE_TYPE_GPU)           ? DeviceType::kGpu
              : (type & CL_DEVICE_TYPE_CPU)         ? DeviceType::kCpu
              : (type & CL_DEVICE_TYPE_ACCELERATOR) ? DeviceType::kAccelerator
                                                    : DeviceType::kOther;

  cl_uint u = 0;
  cl_ulong ul = 0;
  cl_bool b = CL_FALSE;
  INFERD_RETURN_IF_ERROR(device_value(device, CL_DEVICE_MAX_COMPUTE_UNITS, &u));
  info.compute_units = u;
  INFERD_RETURN_IF_ERROR(device_value(device, CL_DEVICE_MAX_CLOCK_FREQUENCY, &u));
  info.max_clock_mhz = u;
  INFERD_RETURN_IF_ERROR(device_value(device, CL_DEVICE_MAX_WORK_GROUP_SIZE, &info.max_work_group_size));
  INFERD_CL_RETURN_IF_ERROR(clGetDeviceInfo(device, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof(info.max_work_item_sizes),
                                            info.max_work_item_sizes, nullptr));
  INFERD_RETURN_IF_ERROR(device_value(device, CL_DEVICE_LOCAL_MEM_SIZE, &ul));
  info.local_mem_bytes = ul;
  INFERD_RETURN_IF_ERROR(device_value(device, CL_DEVICE_GLOBAL_MEM_SIZE, &ul));
  info.global_mem_bytes = ul;
  INFERD_RETURN_IF_ERROR(device_value(device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, &ul));
  info.max_alloc_bytes = ul;
  INFERD_RETURN_IF_ERROR(device_value(device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, &u));
  info.mem_base_addr_align_bytes = u / 8;  // reported in bits

  info.fp16 = info.has_extension("cl_khr_fp16");
  info.fp64 = info.has_extension("cl_khr_fp64");
  cl_device_fp_config fp_config = 0;
  optional_device_value(device, CL_DEVICE_SINGLE_FP_CONFIG, &fp_config);
  info.fp32_correct_div_sqrt = (fp_config & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) != 0;
  info.integer_dot_product = info.has_extension("cl_khr_integer_dot_product");
  if (info.integer_dot_product) {
    cl_bitfield caps = 0;
    optional_device_value(device, CL_DEVICE_INTEGER_DOT_PRODUCT_CAPABILITIES_KHR, &caps);
    info.integer_dot_product_caps = static_cast<uint32_t>(caps);
  }
  info.subgroups = info.has_extension("cl_khr_subgroups") || info.has_extension("cl_intel_subgroups");
  if (info.version_major * 10 + info.version_minor >= 21) {
    cl_uint max_sub_groups = 0;
    optional_device_value(device, CL_DEVICE_MAX_NUM_SUB_GROUPS, &max_sub_groups);
    info.subgroups = info.subgroups || max_sub_groups > 0;
  }
  if (info.has_extension("cl_intel_required_subgroup_size")) {
    size_t size = 0;
    if (clGetDeviceInfo(device, CL_DEVICE_SUB_GROUP_SIZES_INTEL, 0, nullptr, &size) == CL_SUCCESS && size > 0) {
      info.subgroup_sizes.resize(size / sizeof(size_t));
      if (clGetDeviceInfo(device, CL_DEVICE_SUB_GROUP_SIZES_INTEL, size, info.subgroup_sizes.data(), nullptr) !=
          CL_SUCCESS) {
        info.subgroup_sizes.clear();
      }
    }
  }

  INFERD_RETURN_IF_ERROR(device_value(device, CL_DEVICE_IMAGE_SUPPORT, &b));
  info.image_support = b == CL_TRUE;
  if (info.image_support) {
    INFERD_RETURN_IF_ERROR(device_value(device, CL_DEVICE_IMAGE2D_MAX_WIDTH, &info.image2d_max_width));
    INFERD_RETURN_IF_ERROR(device_value(device, CL_DEVICE_IMAGE2D_MAX_HEIGHT, &info.image2d_max_height));
    INFERD_RETURN_IF_ERROR(device_value(device, CL_DEVICE_IMAGE3D_MAX_WIDTH, &info.image3d_max_width));
    INFERD_RETURN_IF_ERROR(device_value(device, CL_DEVICE_IMAGE3D_MAX_HEIGHT, &info.image3d_max_height));
    INFERD_RETURN_IF_ERROR(device_value(device, CL_DEVICE_IMAGE3D_MAX_DEPTH, &info.image3d_max_depth));
    // OpenCL 1.2 properties: absent on 1.1 devices, which then have no image buffers or arrays.
    optional_device_value(device, CL_DEVICE_IMAGE_MAX_BUFFER_SIZE, &info.image_max_buffer_size);
    optional_device_value(device, CL_DEVICE_IMAGE_MAX_ARRAY_SIZE, &info.image_max_array_size);
    if (info.version_major >= 2) {
      cl_uint pitch = 0;
      optional_device_value(device, CL_DEVICE_IMAGE_PITCH_ALIGNMENT, &pitch);
      info.image_pitch_alignment = pitch;
    }
  }
  info.priority_hints = info.has_extension("cl_khr_priority_hints");
  for (const std::string& e : info.extensions) {
    if (is_matrix_extension(e)) info.matrix_extensions.push_back(e);
  }
  return info;
}

Result<std::vector<DeviceHandle>> list_devices() {
  cl_uint n_platforms = 0;
  cl_int err = clGetPlatformIDs(0, nullptr, &n_platforms);
  // The ICD loader answers CL_PLATFORM_NOT_FOUND_KHR when no vendor file is installed.
  if (err == CL_PLATFORM_NOT_FOUND_KHR || (err == CL_SUCCESS && n_platforms == 0)) {
    return Status(Code::kNotFound, "no OpenCL platform (is an OpenCL driver / ICD installed?)");
  }
  if (err != CL_SUCCESS) return cl_error(err, "clGetPlatformIDs");
  std::vector<cl_platform_id> platforms(n_platforms);
  INFERD_CL_RETURN_IF_ERROR(clGetPlatformIDs(n_platforms, platforms.data(), nullptr));

  std::vector<DeviceHandle> devices;
  for (cl_platform_id platform : platforms) {
    cl_uint n_devices = 0;
    err = clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 0, nullptr, &n_devices);
    if (err == CL_DEVICE_NOT_FOUND || n_devices == 0) continue;
    if (err != CL_SUCCESS) return cl_error(err, "clGetDeviceIDs");
    std::vector<cl_device_id> ids(n_devices);
    INFERD_CL_RETURN_IF_ERROR(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, n_devices, ids.data(), nullptr));
    for (cl_device_id id : ids) {
      auto info = query_device_info(platform, id);
      if (!info) return info.status();
      devices.push_back(DeviceHandle{platform, id, std::move(info.value())});
    }
  }
  if (devices.empty()) return Status(Code::kNotFound, "OpenCL platforms exist but have no device");
  return devices;
}

Result<DeviceHandle> select_device(std::string_view selector) {
  auto devices = list_devices();
  if (!devices) return devices.status();
  std::vector<DeviceHandle>& all = devices.value();
  if (selector.empty()) {
    for (DeviceHandle& d : all) {
      if (d.info.type == DeviceType::kGpu) return std::move(d);
    }
    return std::move(all.front());
  }
  if (std::all_of(selector.begin(), selector.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    const size_t index = std::strtoul(std::string(selector).c_str(), nullptr, 10);
    if (selector.size() > 6 || index >= all.size()) {
      return make_error(Code::kNotFound, "OpenCL device %s does not exist (%zu devices)", std::string(selector).c_str(),
                        all.size());
    }
    return std::move(all[index]);
  }
  for (DeviceHandle& d : all) {
    if (d.info.name.find(selector) != std::string::npos) return std::move(d);
  }
  return make_error(Code::kNotFound, "no OpenCL device's name contains '%s'", std::string(selector).c_str());
}

// ---- Program binary cache -----------------------------------------------------------------------

uint64_t fnv1a64(std::string_view data, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char c : data) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string ProgramKey::canonical() const {
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(source_hash));
  return "device=" + device_name + "\ndriver=" + driver_version + "\nsource=" + hash + "\noptions=" + options + "\n";
}

std::string ProgramKey::file_name() const {
  char name[32];
  std::snprintf(name, sizeof(name), "%016llx.clbin", static_cast<unsigned long long>(fnv1a64(canonical())));
  return name;
}

namespace {

constexpr char kCacheMagic[8] = {'I', 'N', 'F', 'D', 'C', 'L', 'B', '1'};
constexpr uint32_t kCacheVersion = 1;
constexpr size_t kCacheHeaderBytes = 32;

template <typename T>
void put(std::vector<unsigned char>& out, T value) {
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // the cache is per machine: host byte order (little-endian)
  out.insert(out.end(), bytes, bytes + sizeof(T));
}

template <typename T>
T get(const unsigned char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

uint64_t entry_checksum(std::string_view key, const unsigned char* binary, size_t n) {
  return fnv1a64(std::string_view(reinterpret_cast<const char*>(binary), n), fnv1a64(key));
}

}  // namespace

std::string ProgramBinaryCache::path_for(const ProgramKey& key) const {
  return (std::filesystem::path(directory_) / key.file_name()).string();
}

Result<std::vector<unsigned char>> ProgramBinaryCache::load(const ProgramKey& key) const {
  const std::string path = path_for(key);
  auto read = read_whole_file(path);
  if (!read) return read.status();
  const std::vector<unsigned char>& data = read.value();

  auto corrupt = [&](const char* why) { return make_error(Code::kCorrupt, "cache entry %s: %s", path.c_str(), why); };
  if (data.size() < kCacheHeaderBytes) return corrupt("shorter than its header");
  if (std::memcmp(data.data(), kCacheMagic, sizeof(kCacheMagic)) != 0) return corrupt("bad magic");
  if (get<uint32_t>(&data[8]) != kCacheVersion) return corrupt("unknown format version");
  const uint64_t key_len = get<uint32_t>(&data[12]);
  const uint64_t bin_len = get<uint64_t>(&data[16]);
  if (bin_len > data.size() || key_len + bin_len + kCacheHeaderBytes != data.size()) return corrupt("size mismatch");
  const std::string_view stored_key(reinterpret_cast<const char*>(&data[kCacheHeaderBytes]), key_len);
  const unsigned char* binary = &data[kCacheHeaderBytes + key_len];
  if (entry_checksum(stored_key, binary, bin_len) != get<uint64_t>(&data[24])) return corrupt("checksum mismatch");
  if (stored_key != key.canonical()) return corrupt("entry belongs to another key");
  if (bin_len == 0) return corrupt("empty binary");
  return std::vector<unsigned char>(binary, binary + bin_len);
}

Status ProgramBinaryCache::store(const ProgramKey& key, const std::vector<unsigned char>& binary) const {
  const std::string canonical = key.canonical();
  std::vector<unsigned char> out;
  out.reserve(kCacheHeaderBytes + canonical.size() + binary.size());
  out.insert(out.end(), kCacheMagic, kCacheMagic + sizeof(kCacheMagic));
  put<uint32_t>(out, kCacheVersion);
  put<uint32_t>(out, static_cast<uint32_t>(canonical.size()));
  put<uint64_t>(out, binary.size());
  put<uint64_t>(out, entry_checksum(canonical, binary.data(), binary.size()));
  out.insert(out.end(), canonical.begin(), canonical.end());
  out.insert(out.end(), binary.begin(), binary.end());
  return write_file_atomically(path_for(key), out);
}

Status write_file_atomically(const std::string& path, std::span<const unsigned char> data) {
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(Code::kFailed, "cannot create %s: %s", dir.c_str(), ec.message().c_str());
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return make_error(Code::kFailed, "cannot create %s: %s", tmp.c_str(), std::strerror(errno));
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t w = ::write(fd, data.data() + done, data.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    done += static_cast<size_t>(w);
  }
  const bool ok = done == data.size() && ::fsync(fd) == 0;
  const int saved_errno = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = ok ? errno : saved_errno;
    ::unlink(tmp.c_str());
    return make_error(Code::kFailed, "cannot write %s: %s", path.c_str(), std::strerror(err));
  }
  return Status::ok();
}

Result<std::vector<unsigned char>> read_whole_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    if (errno == ENOENT) return make_error(Code::kNotFound, "no file %s", path.c_str());
    return make_error(Code::kFailed, "cannot open %s: %s", path.c_str(), std::strerror(errno));
  }
  std::vector<unsigned char> data;
  unsigned char chunk[1 << 16];
  size_t n = 0;
  while ((n = std::fread(chunk, 1, sizeof(chunk), f)) > 0) data.insert(data.end(), chunk, chunk + n);
  const bool read_error = std::ferror(f) != 0;
  std::fclose(f);
  if (read_error) return make_error(Code::kFailed, "cannot read %s", path.c_str());
  return data;
}

std::string default_cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && xdg[0] == '/') {
    return std::string(xdg) + "/inferd/opencl";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0') {
    return std::string(home) + "/.cache/inferd/opencl";
  }
  return "";
}

// ---- Runtime -----------------------------------------------------------------------------------

const char* queue_priority_name(QueuePriority priority) {
  switch (priority) {
    case QueuePriority::kDefault: return "default";
    case QueuePriority::kLow: return "low";
    case QueuePriority::kMedium: return "medium";
    case QueuePriority::kHigh: return "high";
  }
  return "?";
}

Result<std::unique_ptr<Runtime>> Runtime::create(const DeviceHandle& device, RuntimeOptions options) {
  std::unique_ptr<Runtime> rt(new Runtime(device, std::move(options)));
  cl_int err = CL_SUCCESS;
  const cl_context_properties props[] = {CL_CONTEXT_PLATFORM, reinterpret_cast<cl_context_properties>(device.platform),
                                         0};
  rt->context_.reset(clCreateContext(props, 1, &device.device, nullptr, nullptr, &err));
  if (err != CL_SUCCESS) return cl_error(err, "clCreateContext");

  const cl_command_queue_properties queue_flags = rt->options_.profiling ? CL_QUEUE_PROFILING_ENABLE : 0;
  const DeviceInfo& info = device.info;
  if (info.priority_hints && rt->options_.priority != QueuePriority::kDefault) {
    const cl_queue_properties priority = rt->options_.priority == QueuePriority::kLow    ? CL_QUEUE_PRIORITY_LOW_KHR
                                         : rt->options_.priority == QueuePriority::kHigh ? CL_QUEUE_PRIORITY_HIGH_KHR
                                                                                         : CL_QUEUE_PRIORITY_MED_KHR;
    const cl_queue_properties qprops[] = {CL_QUEUE_PROPERTIES, queue_flags, CL_QUEUE_PRIORITY_KHR, priority, 0};
    rt->queue_.reset(clCreateCommandQueueWithProperties(rt->context(), device.device, qprops, &err));
    // A driver that advertises the extension but rejects the property still gets a plain queue.
    if (err == CL_SUCCESS) rt->priority_ = rt->options_.priority;
  }
  if (!rt->queue_) {
    if (info.version_major >= 2) {
      const cl_queue_properties qprops[] = {CL_QUEUE_PROPERTIES, queue_flags, 0};
      rt->queue_.reset(clCreateCommandQueueWithProperties(rt->context(), device.device, qprops, &err));
    } else {
      rt->queue_.reset(clCreateCommandQueue(rt->context(), device.device, queue_flags, &err));
    }
    if (err != CL_SUCCESS) return cl_error(err, "clCreateCommandQueue");
  }
  return rt;
}

Result<std::unique_ptr<Runtime>> Runtime::create_default(RuntimeOptions options, std::string_view selector) {
  auto device = select_device(selector);
  if (!device) return device.status();
  return create(device.value(), std::move(options));
}

Result<ClProgram> Runtime::build_from_source(std::string_view source, const std::string& options) const {
  const char* text = source.data();
  const size_t length = source.size();
  cl_int err = CL_SUCCESS;
  ClProgram program(clCreateProgramWithSource(context(), 1, &text, &length, &err));
  if (err != CL_SUCCESS) return cl_error(err, "clCreateProgramWithSource");
  err = clBuildProgram(program.get(), 1, &device_.device, options.c_str(), nullptr, nullptr);
  if (err != CL_SUCCESS) {
    std::string log;
    size_t size = 0;
    if (clGetProgramBuildInfo(program.get(), device_.device, CL_PROGRAM_BUILD_LOG, 0, nullptr, &size) == CL_SUCCESS) {
      log.resize(size);
      if (clGetProgramBuildInfo(program.get(), device_.device, CL_PROGRAM_BUILD_LOG, size, log.data(), nullptr) !=
          CL_SUCCESS) {
        log = "(no build log)";
      }
      while (!log.empty() && log.back() == '\0') log.pop_back();
    }
    return Status(Code::kFailed, cl_error(err, "clBuildProgram").message() + " with options '" + options +
                                     "'; build log:\n" + log);
  }
  return program;
}

Result<ClProgram> Runtime::build_from_binary(const std::vector<unsigned char>& binary, const std::string& options) const {
  const unsigned char* bytes = binary.data();
  const size_t length = binary.size();
  cl_int binary_status = CL_SUCCESS, err = CL_SUCCESS;
  ClProgram program(clCreateProgramWithBinary(context(), 1, &device_.device, &length, &bytes, &binary_status, &err));
  if (err != CL_SUCCESS) return cl_error(err, "clCreateProgramWithBinary");
  if (binary_status != CL_SUCCESS) return cl_error(binary_status, "clCreateProgramWithBinary (binary status)");
  INFERD_CL_RETURN_IF_ERROR(clBuildProgram(program.get(), 1, &device_.device, options.c_str(), nullptr, nullptr));
  return program;
}

// The program for (source, options) from the disk cache or compiled (and then stored); touches only this
// Runtime's immutable state and the cache directory, so several threads may run it at once. `stats`
// counts what happened.
Result<ClProgram> Runtime::load_or_compile(std::string_view source, const std::string& options,
                                           ProgramCacheStats& stats) const {
  const ProgramKey key{info().name, info().driver_version, fnv1a64(source), options};
  if (!options_.cache_dir.empty()) {
    ProgramBinaryCache cache(options_.cache_dir);
    auto binary = cache.load(key);
    if (binary) {
      auto loaded = build_from_binary(binary.value(), options);
      if (loaded) {
        ++stats.disk_hits;
        return std::move(loaded).value();
      }
      ++stats.disk_rejected;  // e.g. a driver update that kept its version string
    } else if (binary.status().code() != Code::kNotFound) {
      ++stats.disk_rejected;
    }
  }
  auto built = build_from_source(source, options);
  if (!built) return built.status();
  ClProgram program = std::move(built).value();
  ++stats.compiled;
  if (!options_.cache_dir.empty()) {
    size_t size = 0;
    std::vector<unsigned char> binary;
    bool have_binary =
        clGetProgramInfo(program.get(), CL_PROGRAM_BINARY_SIZES, sizeof(size), &size, nullptr) == CL_SUCCESS && size > 0;
    if (have_binary) {
      binary.resize(size);
      unsigned char* ptr = binary.data();
      have_binary = clGetProgramInfo(program.get(), CL_PROGRAM_BINARIES, sizeof(ptr), &ptr, nullptr) == CL_SUCCESS;
    }
    if (!have_binary || !ProgramBinaryCache(options_.cache_dir).store(key, binary)) ++stats.store_failures;
  }
  return program;
}

namespace {
std::string memory_key(std::string_view source, const std::string& options) {
  // In memory the key is the exact text: no hash collisions within one process.
  std::string key = options;
  key.push_back('\0');
  key.append(source);
  return key;
}

void add_stats(ProgramCacheStats& to, const ProgramCacheStats& from) {
  to.memory_hits += from.memory_hits;
  to.disk_hits += from.disk_hits;
  to.disk_rejected += from.disk_rejected;
  to.compiled += from.compiled;
  to.store_failures += from.store_failures;
}
}  // namespace

Result<cl_program> Runtime::build_program(std::string_view source, std::string_view options_view) {
  const std::string options(options_view);
  std::string key = memory_key(source, options);
  if (auto it = programs_.find(key); it != programs_.end()) {
    ++stats_.memory_hits;
    return it->second.get();
  }
  auto program = load_or_compile(source, options, stats_);
  if (!program) return program.status();
  cl_program handle = program->get();
  programs_.emplace(std::move(key), std::move(program).value());
  return handle;
}

std::vector<Result<cl_program>> Runtime::build_programs(std::span<const std::string> sources, std::string_view options_view,
                                                        int max_threads) {
  const std::string options(options_view);
  std::vector<Result<cl_program>> out(sources.size(), Result<cl_program>(Status(Code::kFailed, "not built")));
  std::vector<std::string> keys(sources.size());
  std::vector<size_t> todo;               // the sources this Runtime has not built yet, first occurrences
  std::vector<size_t> same(sources.size());  // each source's first occurrence in the batch
  std::map<std::string_view, size_t> first;
  for (size_t i = 0; i < sources.size(); ++i) {
    keys[i] = memory_key(sources[i], options);
    same[i] = first.emplace(keys[i], i).first->second;
    if (same[i] != i) continue;
    if (auto it = programs_.find(keys[i]); it != programs_.end()) {
      ++stats_.memory_hits;
      out[i] = it->second.get();
    } else {
      todo.push_back(i);
    }
  }
  std::vector<std::optional<Result<ClProgram>>> built(todo.size());
  std::vector<ProgramCacheStats> stats(todo.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t j = next++; j < todo.size(); j = next++) built[j].emplace(load_or_compile(sources[todo[j]], options, stats[j]));
  };
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t n_threads = std::min(todo.size(), max_threads > 0 ? static_cast<size_t>(max_threads) : hw);
  std::vector<std::thread> threads;
  for (size_t t = 1; t < n_threads; ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  for (size_t j = 0; j < todo.size(); ++j) {
    add_stats(stats_, stats[j]);
    const size_t i = todo[j];
    if (!*built[j]) {
      out[i] = built[j]->status();
      continue;
    }
    out[i] = built[j]->value().get();
    programs_.emplace(std::move(keys[i]), std::move(*built[j]).value());
  }
  for (size_t i = 0; i < sources.size(); ++i) {  // repeats within the batch: their first occurrence's result
    if (same[i] == i) continue;
    out[i] = out[same[i]];
    if (out[i]) ++stats_.memory_hits;
  }
  return out;
}

Result<ClMem> Runtime::create_buffer(size_t bytes, cl_mem_flags flags, const void* host) {
  if (bytes == 0) return Status(Code::kInvalidArgument, "create_buffer: zero bytes");
  if (host != nullptr) flags |= CL_MEM_COPY_HOST_PTR;
  cl_int err = CL_SUCCESS;
  ClMem mem(clCreateBuffer(context(), flags, bytes, const_cast<void*>(host), &err));
  if (err != CL_SUCCESS) return cl_error(err, "clCreateBuffer(" + std::to_string(bytes) + " bytes)");
  return mem;
}

Status Runtime::write_buffer(cl_mem buffer, size_t offset, size_t bytes, const void* host, Transfer how) {
  const cl_bool wait = blocking(how);
  INFERD_CL_RETURN_IF_ERROR(clEnqueueWriteBuffer(queue(), buffer, wait, offset, bytes, host, 0, nullptr, nullptr));
  return Status::ok();
}

Status Runtime::read_buffer(cl_mem buffer, size_t offset, size_t bytes, void* host, Transfer how) {
  const cl_bool wait = blocking(how);
  INFERD_CL_RETURN_IF_ERROR(clEnqueueReadBuffer(queue(), buffer, wait, offset, bytes, host, 0, nullptr, nullptr));
  return Status::ok();
}

Status Runtime::write_image(cl_mem image, const size_t (&origin)[3], const size_t (&region)[3], size_t row_pitch,
                            size_t slice_pitch, const void* host, Transfer how) {
  const cl_bool wait = blocking(how);
  INFERD_CL_RETURN_IF_ERROR(
      clEnqueueWriteImage(queue(), image, wait, origin, region, row_pitch, slice_pitch, host, 0, nullptr, nullptr));
  return Status::ok();
}

Status Runtime::read_image(cl_mem image, const size_t (&origin)[3], const size_t (&region)[3], size_t row_pitch,
                           size_t slice_pitch, void* host, Transfer how) {
  const cl_bool wait = blocking(how);
  INFERD_CL_RETURN_IF_ERROR(
      clEnqueueReadImage(queue(), image, wait, origin, region, row_pitch, slice_pitch, host, 0, nullptr, nullptr));
  return Status::ok();
}

Status Runtime::finish() {
  ++host_waits_;
  INFERD_CL_RETURN_IF_ERROR(clFinish(queue()));
  return Status::ok();
}

}  // namespace inferd::opencl
