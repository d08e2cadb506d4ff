// section_table.h — the table of embedded sections, defined by the .cpp file embed_opencl.cmake
// generates from the .cl files at build time and read by opencl_sources.cpp (private to this library).
// Thread safety: immutable static data.
#pragma once

#include <span>
#include <string_view>

namespace inferd::kernels::opencl_detail {

struct SectionEntry {
  std::string_view file;     // "norm.cl"
  std::string_view section;  // "rms_norm.sum"
  std::string_view text;     // a NUL-terminated literal
};

// Every section of every .cl file, in file order.
std::span<const SectionEntry> sections();

}  // namespace inferd::kernels::opencl_detail
