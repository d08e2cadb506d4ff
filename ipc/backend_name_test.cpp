#include "inferd/ipc/backend_name.h"

#include <gtest/gtest.h>

namespace inferd::ipc {
namespace {

TEST(BackendName, FamilyAndDevice) {
  auto cpu = parse_backend_name("cpu");
  ASSERT_TRUE(cpu);
  EXPECT_EQ(cpu->family, "cpu");
  EXPECT_EQ(cpu->device, "");
  auto ocl = parse_backend_name("opencl:12");
  ASSERT_TRUE(ocl);
  EXPECT_EQ(ocl->family, "opencl");
  EXPECT_EQ(ocl->device, "12");
  for (const char* bad : {"", ":1", "opencl:", "opencl:x", "opencl:1:2", "opencl:-1", "cpu:0"}) {
    EXPECT_FALSE(parse_backend_name(bad)) << bad;
  }
}

}  // namespace
}  // namespace inferd::ipc
