#include "inferd/kernels/opencl_sources.h"

#include <cstdio>
#include <vector>

#include "inferd/status.h"
#include "section_table.h"

namespace inferd::kernels {

namespace {

// Prints what names the failed lookup before INFERD_ASSERT aborts (its message is a literal).
void report(const char* what, std::string_view name, std::string_view file, std::string_view section) {
  std::fprintf(stderr, "inferd: %s '%.*s' (kernels/opencl/%.*s, section %.*s)\n", what,
               static_cast<int>(name.size()), name.data(), static_cast<int>(file.size()), file.data(),
               static_cast<int>(section.size()), section.data());
}

}  // namespace

std::string_view opencl_section(std::string_view file, std::string_view section) {
  for (const opencl_detail::SectionEntry& e : opencl_detail::sections()) {
    if (e.file == file && e.section == section) return e.text;
  }
  report("no such OpenCL section", section, file, section);
  INFERD_ASSERT(false, "unknown OpenCL section");
}

std::string opencl_section(std::string_view file, std::string_view section,
                           std::initializer_list<std::pair<std::string_view, std::string_view>> values) {
  const std::string_view text = opencl_section(file, section);
  std::vector<bool> used(values.size(), false);
  std::string out;
  size_t at = 0;
  for (size_t open = text.find('@'); open != std::string_view::npos; open = text.find('@', at)) {
    const size_t close = text.find('@', open + 1);
    INFERD_ASSERT(close != std::string_view::npos, "unterminated placeholder");
    const std::string_view name = text.substr(open + 1, close - open - 1);
    size_t i = 0;
    while (i < values.size() && values.begin()[i].first != name) ++i;
    if (i == values.size()) {
      report("no value for placeholder", name, file, section);
      INFERD_ASSERT(false, "placeholder without a value");
    }
    used[i] = true;
    out.append(text.substr(at, open - at)).append(values.begin()[i].second);
    at = close + 1;
  }
  out.append(text.substr(at));
  for (size_t i = 0; i < values.size(); ++i) {
    if (!used[i]) {
      report("a value for no placeholder", values.begin()[i].first, file, section);
      INFERD_ASSERT(false, "value without a placeholder");
    }
  }
  return out;
}

}  // namespace inferd::kernels
