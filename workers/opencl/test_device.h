// test_device.h — the OpenCL device inferd_opencl_test runs on (shared by its test files).
//
// One Runtime per test process, created on first use: INFERD_OPENCL_DEVICE selects the device
// (select_device()'s syntax: "", an index, or part of the name). Tests that need a device skip with
// the reason when there is none (no ICD, no driver), so the suite passes on machines without OpenCL.
// Thread safety: tests run on one thread.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "inferd/opencl/cl_runtime.h"

namespace inferd::opencl::testing {

// A new runtime on the test device, for a test (an engine) that owns its own.
inline Result<std::unique_ptr<Runtime>> new_test_runtime(const RuntimeOptions& options = {}) {
  const char* selector = std::getenv("INFERD_OPENCL_DEVICE");
  return Runtime::create_default(options, selector != nullptr ? selector : "");
}

// The process's runtime, or nullptr with `why` set.
inline Runtime* test_runtime(std::string* why) {
  static Result<std::unique_ptr<Runtime>> runtime = new_test_runtime();
  if (!runtime) {
    *why = runtime.status().to_string();
    return nullptr;
  }
  return runtime.value().get();
}

}  // namespace inferd::opencl::testing

// Declares `Runtime* var`, or skips the test when no OpenCL device is available.
#define INFERD_OPENCL_RUNTIME_OR_SKIP(var)                                     \
  std::string var##_skip_reason;                                               \
  ::inferd::opencl::Runtime* var = ::inferd::opencl::testing::test_runtime(&var##_skip_reason); \
  if (var == nullptr) GTEST_SKIP() << "no OpenCL device: " << var##_skip_reason
