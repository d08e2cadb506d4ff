// Tests of the OpenCL runtime: error names, version parsing, the binary cache's file format (no
// device needed), then device enumeration, queues, program builds and the cache on a real device
// (skipped without one).
#include "inferd/opencl/cl_runtime.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "test_device.h"

namespace inferd::opencl {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the system's temporary directory, removed when the test ends.
class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(fs::temp_directory_path() / ("inferd_opencl_test_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

std::vector<unsigned char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::vector<unsigned char>& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

TEST(ClRuntime, ErrorNames) {
  EXPECT_STREQ(cl_error_name(CL_SUCCESS), "CL_SUCCESS");
  EXPECT_STREQ(cl_error_name(-5), "CL_OUT_OF_RESOURCES");
  EXPECT_STREQ(cl_error_name(-11), "CL_BUILD_PROGRAM_FAILURE");
  EXPECT_STREQ(cl_error_name(-54), "CL_INVALID_WORK_GROUP_SIZE");
  EXPECT_STREQ(cl_error_name(-1001), "CL_PLATFORM_NOT_FOUND_KHR");
  EXPECT_STREQ(cl_error_name(12345), "CL_UNKNOWN_ERROR");

  const Status s = cl_error(CL_INVALID_KERNEL_ARGS, "clEnqueueNDRangeKernel");
  EXPECT_EQ(s.code(), Code::kFailed);
  EXPECT_EQ(s.message(), "clEnqueueNDRangeKernel: CL_INVALID_KERNEL_ARGS (-52)");
  EXPECT_EQ(cl_error(CL_DEVICE_NOT_FOUND, "clGetDeviceIDs").code(), Code::kNotFound);
}

Status failing_call() {
  INFERD_CL_RETURN_IF_ERROR(clReleaseMemObject(nullptr));  // CL_INVALID_MEM_OBJECT
  return Status::ok();
}

TEST(ClRuntime, CheckMacroNamesTheCallAndTheLine) {
  const Status s = failing_call();
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("clReleaseMemObject at cl_runtime_test.cpp:"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("CL_INVALID_MEM_OBJECT (-38)"), std::string::npos) << s.message();
}

TEST(ClRuntime, ParsesVersions) {
  EXPECT_EQ(parse_opencl_version("OpenCL 3.0 PoCL 3.1+debian"), std::make_pair(3, 0));
  EXPECT_EQ(parse_opencl_version("OpenCL C 1.2 PoCL"), std::make_pair(1, 2));
  EXPECT_EQ(parse_opencl_version("OpenCL 2.1 "), std::make_pair(2, 1));
  EXPECT_EQ(parse_opencl_version("Vulkan 1.3"), std::make_pair(0, 0));
  EXPECT_EQ(parse_opencl_version("OpenCL x.y"), std::make_pair(0, 0));
  EXPECT_EQ(parse_opencl_version(""), std::make_pair(0, 0));
}

TEST(ClRuntime, RecognisesMatrixExtensions) {
  EXPECT_TRUE(is_matrix_extension("cl_intel_subgroup_matrix_multiply_accumulate"));
  EXPECT_TRUE(is_matrix_extension("cl_qcom_dot_product8"));
  EXPECT_TRUE(is_matrix_extension("cl_arm_integer_dot_product_int8"));
  EXPECT_FALSE(is_matrix_extension("cl_khr_fp16"));
  EXPECT_FALSE(is_matrix_extension("cl_intel_subgroups"));
}

TEST(ProgramBinaryCache, Fnv1aMatchesReferenceVectors) {
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ull);
}

ProgramKey test_key(const std::string& options = "-cl-std=CL1.2") {
  return ProgramKey{"Test Device", "1.0", fnv1a64("__kernel void k() {}"), options};
}

TEST(ProgramBinaryCache, StoresAndLoadsAtomically) {
  TempDir dir("cache_roundtrip");
  ProgramBinaryCache cache(dir.str() + "/nested/opencl");
  const std::vector<unsigned char> binary = {1, 2, 3, 250, 0, 7};
  EXPECT_EQ(cache.load(test_key()).status().code(), Code::kNotFound);
  ASSERT_TRUE(cache.store(test_key(), binary).is_ok());
  auto loaded = cache.load(test_key());
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded.value(), binary);
  // Different options are a different entry.
  EXPECT_NE(cache.path_for(test_key()), cache.path_for(test_key("-cl-fast-relaxed-math")));
  EXPECT_EQ(cache.load(test_key("-cl-fast-relaxed-math")).status().code(), Code::kNotFound);
  // Nothing but the entry is left behind (the temporary file was renamed).
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir.str() + "/nested/opencl")) {
    ++files;
    EXPECT_EQ(entry.path().extension(), ".clbin");
  }
  EXPECT_EQ(files, 1);
}

TEST(ProgramBinaryCache, RejectsCorruptEntries) {
  TempDir dir("cache_corrupt");
  ProgramBinaryCache cache(dir.str());
  const std::vector<unsigned char> binary(100, 0x5a);
  ASSERT_TRUE(cache.store(test_key(), binary).is_ok());
  const std::string path = cache.path_for(test_key());
  const std::vector<unsigned char> good = read_file(path);
  ASSERT_GT(good.size(), 132u);

  auto expect_corrupt = [&](std::vector<unsigned char> data, const char* what) {
    write_file(path, data);
    const auto r = cache.load(test_key());
    EXPECT_EQ(r.status().code(), Code::kCorrupt) << what << ": " << r.status().to_string();
  };
  expect_corrupt({}, "empty file");
  expect_corrupt(std::vector<unsigned char>(good.begin(), good.end() - 1), "truncated");
  auto flipped = good;
  flipped[good.size() - 10] ^= 0x01;
  expect_corrupt(flipped, "a flipped bit in the binary");
  auto magic = good;
  magic[0] = 'X';
  expect_corrupt(magic, "bad magic");
  auto version = good;
  version[8] = 2;
  expect_corrupt(version, "future version");
  auto longer = good;
  longer.push_back(0);
  expect_corrupt(longer, "trailing bytes");

  // A whole, valid entry of another key under this key's name.
  ASSERT_TRUE(cache.store(test_key("-other"), binary).is_ok());
  expect_corrupt(read_file(cache.path_for(test_key("-other"))), "another key's entry");

  // Storing again repairs it.
  ASSERT_TRUE(cache.store(test_key(), binary).is_ok());
  EXPECT_TRUE(cache.load(test_key()).is_ok());
}

TEST(ProgramBinaryCache, DefaultDirectoryFollowsXdg) {
  const char* old_xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old_xdg ? old_xdg : "";
  ::setenv("XDG_CACHE_HOME", "/var/cache/test", 1);
  EXPECT_EQ(default_cache_dir(), "/var/cache/test/inferd/opencl");
  if (old_xdg) {
    ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  } else {
    ::unsetenv("XDG_CACHE_HOME");
  }
}

// ---- On a device ----------------------------------------------------------------------------------

TEST(ClRuntimeDevice, EnumeratesDevicesWithTheirCapabilities) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  auto devices = list_devices();
  ASSERT_TRUE(devices.is_ok()) << devices.status().to_string();
  ASSERT_FALSE(devices->empty());
  for (const DeviceHandle& d : devices.value()) {
    const DeviceInfo& info = d.info;
    SCOPED_TRACE(info.name);
    EXPECT_FALSE(info.name.empty());
    EXPECT_GE(info.version_major, 1);
    EXPECT_GE(info.c_version_major, 1);
    EXPECT_GT(info.compute_units, 0u);
    EXPECT_GT(info.max_work_group_size, 0u);
    EXPECT_GT(info.max_alloc_bytes, 0u);
    EXPECT_GT(info.mem_base_addr_align_bytes, 0u);
    EXPECT_TRUE(std::is_sorted(info.extensions.begin(), info.extensions.end()));
    EXPECT_EQ(info.fp16, info.has_extension("cl_khr_fp16"));
    EXPECT_EQ(info.priority_hints, info.has_extension("cl_khr_priority_hints"));
    if (info.image_support) {
      EXPECT_GE(info.image2d_max_width, 2048u);  // the OpenCL 1.2 minimum for a full profile
      EXPECT_GE(info.image2d_max_height, 2048u);
    }
    EXPECT_NE(info.to_string().find(info.name), std::string::npos);
  }
}

TEST(ClRuntimeDevice, SelectorsThatMatchNothingAreErrors) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  EXPECT_EQ(select_device("999").status().code(), Code::kNotFound);
  EXPECT_EQ(select_device("no device is called this").status().code(), Code::kNotFound);
  auto first = select_device("0");
  ASSERT_TRUE(first.is_ok());
  auto by_name = select_device(first->info.name);
  ASSERT_TRUE(by_name.is_ok());
  EXPECT_EQ(by_name->info.name, first->info.name);
}

TEST(ClRuntimeDevice, QueuePriorityIsLowOnlyWithPriorityHints) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  EXPECT_EQ(rt->queue_priority(), rt->info().priority_hints ? QueuePriority::kLow : QueuePriority::kDefault);
  EXPECT_NE(rt->queue(), nullptr);
}

constexpr const char* kFill42 = R"(__kernel void fill42(__global int* out) { out[get_global_id(0)] = 42; })";

// The device the tests run on (INFERD_OPENCL_DEVICE, else the default).
Result<DeviceHandle> test_device() {
  return select_device(std::getenv("INFERD_OPENCL_DEVICE") ? std::getenv("INFERD_OPENCL_DEVICE") : "");
}

// Runtime options with the program binary cache in `dir`.
RuntimeOptions cached_at(const TempDir& dir) {
  RuntimeOptions options;
  options.cache_dir = dir.str();
  return options;
}

// Runs fill42 from `program` on 8 ints and returns them.
std::vector<cl_int> run_fill42(Runtime& rt, cl_program program) {
  cl_int err = CL_SUCCESS;
  ClKernel kernel(clCreateKernel(program, "fill42", &err));
  EXPECT_EQ(err, CL_SUCCESS) << cl_error_name(err);
  auto buffer = rt.create_buffer(8 * sizeof(cl_int));
  EXPECT_TRUE(buffer.is_ok());
  const cl_mem mem = buffer->get();
  EXPECT_EQ(clSetKernelArg(kernel.get(), 0, sizeof(mem), &mem), CL_SUCCESS);
  const size_t global = 8;
  EXPECT_EQ(clEnqueueNDRangeKernel(rt.queue(), kernel.get(), 1, nullptr, &global, nullptr, 0, nullptr, nullptr),
            CL_SUCCESS);
  std::vector<cl_int> out(8, 0);
  EXPECT_TRUE(rt.read_buffer(mem, 0, out.size() * sizeof(cl_int), out.data()).is_ok());
  return out;
}

TEST(ClRuntimeDevice, BuildFailureReturnsTheBuildLog) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  auto r = rt->build_program("__kernel void broken(__global int* o) { o[0] = undeclared_thing; }", "");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kFailed);
  EXPECT_NE(r.status().message().find("CL_BUILD_PROGRAM_FAILURE"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("undeclared_thing"), std::string::npos) << r.status().message();
}

TEST(ClRuntimeDevice, ProgramsAreBuiltOncePerRuntime) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  const ProgramCacheStats before = rt->cache_stats();
  auto a = rt->build_program(kFill42, "-cl-std=CL1.2");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  auto b = rt->build_program(kFill42, "-cl-std=CL1.2");
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(a.value(), b.value());
  EXPECT_EQ(rt->cache_stats().memory_hits, before.memory_hits + 1);
  EXPECT_EQ(run_fill42(*rt, a.value()), std::vector<cl_int>(8, 42));
}

// build_programs(): one result per source in order; a source repeated in the batch or built before is built
// once; a source that does not build fails alone, with its build log; a second runtime on the same cache
// directory loads the whole batch from disk.
TEST(ClRuntimeDevice, BuildProgramsBuildsABatchSideBySide) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  TempDir dir("runtime_batch");
  auto device = test_device();
  ASSERT_TRUE(device.is_ok());
  const RuntimeOptions options = cached_at(dir);
  const std::string build_options = "-cl-std=CL1.2 -DINFERD_BATCH_TEST";
  auto fill = [](int v) {
    return "__kernel void fill42(__global int* o) { o[get_global_id(0)] = " + std::to_string(v) + "; }";
  };
  const std::vector<std::string> sources = {fill(42), fill(7), fill(42), "__kernel void broken() { nope; }", fill(9)};

  auto first = Runtime::create(device.value(), options);
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  Runtime& r1 = *first.value();
  auto earlier = r1.build_program(fill(9), build_options);
  ASSERT_TRUE(earlier.is_ok()) << earlier.status().to_string();
  const ProgramCacheStats before = r1.cache_stats();
  std::vector<Result<cl_program>> built = r1.build_programs(sources, build_options, 2);
  ASSERT_EQ(built.size(), sources.size());
  for (size_t i : {0u, 1u, 2u, 4u}) ASSERT_TRUE(built[i].is_ok()) << i << ": " << built[i].status().to_string();
  ASSERT_FALSE(built[3].is_ok());
  EXPECT_NE(built[3].status().message().find("nope"), std::string::npos) << built[3].status().message();
  EXPECT_EQ(built[0].value(), built[2].value());
  EXPECT_EQ(built[4].value(), earlier.value());
  EXPECT_EQ(r1.cache_stats().compiled, before.compiled + 2);  // fill(42) and fill(7); the broken one failed
  EXPECT_EQ(run_fill42(r1, built[0].value()), std::vector<cl_int>(8, 42));
  EXPECT_EQ(run_fill42(r1, built[1].value()), std::vector<cl_int>(8, 7));
  EXPECT_EQ(run_fill42(r1, built[4].value()), std::vector<cl_int>(8, 9));
  if (r1.cache_stats().store_failures > 0) GTEST_SKIP() << "the driver returns no program binaries";

  auto second = Runtime::create(device.value(), options);
  ASSERT_TRUE(second.is_ok());
  std::vector<Result<cl_program>> loaded = second.value()->build_programs(
      std::vector<std::string>{fill(42), fill(7), fill(9)}, build_options);
  for (const auto& p : loaded) ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(second.value()->cache_stats().disk_hits, 3);
  EXPECT_EQ(second.value()->cache_stats().compiled, 0);
  EXPECT_EQ(run_fill42(*second.value(), loaded[1].value()), std::vector<cl_int>(8, 7));
}

// The disk cache: a second runtime loads the binary the first stored; a corrupt entry is rebuilt
// and rewritten, and the program from every path runs.
TEST(ClRuntimeDevice, BinaryCacheHitsAndRebuildsCorruptEntries) {
  INFERD_OPENCL_RUNTIME_OR_SKIP(rt);
  TempDir dir("runtime_cache");
  auto device = test_device();
  ASSERT_TRUE(device.is_ok());
  const RuntimeOptions options = cached_at(dir);
  const std::string build_options = "-cl-std=CL1.2 -DINFERD_CACHE_TEST";

  auto first = Runtime::create(device.value(), options);
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  auto p1 = first.value()->build_program(kFill42, build_options);
  ASSERT_TRUE(p1.is_ok()) << p1.status().to_string();
  const ProgramCacheStats s1 = first.value()->cache_stats();
  EXPECT_EQ(s1.compiled, 1);
  EXPECT_EQ(s1.disk_hits, 0);
  if (s1.store_failures > 0) GTEST_SKIP() << "the driver returns no program binaries";

  const ProgramKey key{device->info.name, device->info.driver_version, fnv1a64(kFill42), build_options};
  ProgramBinaryCache cache(dir.str());
  ASSERT_TRUE(cache.load(key).is_ok());

  auto second = Runtime::create(device.value(), options);
  ASSERT_TRUE(second.is_ok());
  auto p2 = second.value()->build_program(kFill42, build_options);
  ASSERT_TRUE(p2.is_ok()) << p2.status().to_string();
  EXPECT_EQ(second.value()->cache_stats().disk_hits, 1);
  EXPECT_EQ(second.value()->cache_stats().compiled, 0);
  EXPECT_EQ(run_fill42(*second.value(), p2.value()), std::vector<cl_int>(8, 42));

  // Corrupt the entry's binary (its checksum no longer matches).
  std::vector<unsigned char> bytes = read_file(cache.path_for(key));
  bytes[bytes.size() / 2] ^= 0xff;
  write_file(cache.path_for(key), bytes);
  auto third = Runtime::create(device.value(), options);
  ASSERT_TRUE(third.is_ok());
  auto p3 = third.value()->build_program(kFill42, build_options);
  ASSERT_TRUE(p3.is_ok()) << p3.status().to_string();
  EXPECT_EQ(third.value()->cache_stats().disk_rejected, 1);
  EXPECT_EQ(third.value()->cache_stats().compiled, 1);
  EXPECT_EQ(run_fill42(*third.value(), p3.value()), std::vector<cl_int>(8, 42));
  EXPECT_TRUE(cache.load(key).is_ok()) << "the rebuilt program was not stored again";

  // A checksum-valid entry whose binary the driver rejects is rebuilt as well.
  ASSERT_TRUE(cache.store(key, std::vector<unsigned char>(64, 0x11)).is_ok());
  third.value()->clear_memory_cache();
  auto p4 = third.value()->build_program(kFill42, build_options);
  ASSERT_TRUE(p4.is_ok()) << p4.status().to_string();
  EXPECT_EQ(third.value()->cache_stats().disk_rejected, 2);
  EXPECT_EQ(run_fill42(*third.value(), p4.value()), std::vector<cl_int>(8, 42));
}

}  // namespace
}  // namespace inferd::opencl
