#include "inferd/kernels/opencl_sources.h"

#include <gtest/gtest.h>

#include "section_table.h"

namespace inferd::kernels {
namespace {

TEST(OpenclSources, SectionsAreWholeLinesWithoutMarkers) {
  ASSERT_FALSE(opencl_detail::sections().empty());
  for (const opencl_detail::SectionEntry& e : opencl_detail::sections()) {
    SCOPED_TRACE(std::string(e.file) + " " + std::string(e.section));
    ASSERT_FALSE(e.text.empty());
    EXPECT_EQ(e.text.back(), '\n');
    EXPECT_EQ(e.text.data()[e.text.size()], '\0');
    EXPECT_EQ(e.text.find("//@"), std::string_view::npos);
    EXPECT_EQ(opencl_section(e.file, e.section).data(), e.text.data());
  }
}

TEST(OpenclSources, PlaceholdersAreFilled) {
  const std::string reduce = opencl_section("helpers.cl", "reduce", {{"op", "fmax"}});
  EXPECT_NE(reduce.find("scratch[lid] = fmax(scratch[lid], scratch[lid + off]);\n"), std::string::npos);
  EXPECT_EQ(reduce.find('@'), std::string::npos);
}

TEST(OpenclSourcesDeathTest, UnknownNamesAndMissingValuesAreBugs) {
  EXPECT_DEATH(opencl_section("helpers.cl", "no_such_section"), "no_such_section");
  EXPECT_DEATH(opencl_section("no_such_file.cl", "reduce"), "no_such_file.cl");
  EXPECT_DEATH(opencl_section("helpers.cl", "reduce", {}), "placeholder .op.");
  EXPECT_DEATH(opencl_section("helpers.cl", "reduce", {{"op", "fmax"}, {"unused", "1"}}), "unused");
}

}  // namespace
}  // namespace inferd::kernels
