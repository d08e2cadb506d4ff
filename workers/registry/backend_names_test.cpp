#include "inferd/backend_names.h"

#include <gtest/gtest.h>

namespace inferd {
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

TEST(BackendName, EveryFamilyIsKnownOnceAndTheCpuIsBuilt) {
  const BackendFamily* cpu = find_backend_family("cpu");
  ASSERT_NE(cpu, nullptr);
  EXPECT_TRUE(cpu->built);
  EXPECT_FALSE(cpu->has_devices);
  EXPECT_TRUE(check_backend_name("cpu"));
  for (const BackendFamily& f : backend_families()) {
    EXPECT_EQ(find_backend_family(f.name), &f) << f.name << " is listed twice";
    if (f.has_devices) {
      const std::string indexed = std::string(f.name) + ":3";
      EXPECT_EQ(check_backend_name(indexed).code(), f.built ? Code::kOk : Code::kUnimplemented) << indexed;
    }
  }
}

TEST(BackendName, UnknownAndUnbuiltBackendsAreRefusedClearly) {
  Status unknown = check_backend_name("tpu");
  EXPECT_EQ(unknown.code(), Code::kInvalidArgument);
  EXPECT_NE(unknown.message().find("expected cpu"), std::string::npos) << unknown.message();
  EXPECT_EQ(check_backend_name("cpu:0").code(), Code::kInvalidArgument);
  EXPECT_EQ(check_backend_name("opencl:x").code(), Code::kInvalidArgument);
  for (const BackendFamily& f : backend_families()) {
    if (f.built) continue;
    Status s = check_backend_name(f.name);
    EXPECT_EQ(s.code(), Code::kUnimplemented) << f.name;
    EXPECT_NE(s.message().find("not available in this build"), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace inferd
