// inferd/kernels/opencl_sources.h — the OpenCL C text of the OpenCL backend's kernels
// (workers/opencl/ops.cpp), written in kernels/opencl/*.cl and embedded at build time.
//
// A .cl file holds named sections, the pieces ops.cpp assembles into one program per op and
// tensor format (the `$tensor.Read(...)` accessors in them are codegen.h's):
//   //@ <name>    opens section <name>: letters, digits, '_' and '.', unique within its file
//   ...           the section's text: the lines up to the closing marker (at least one), each with
//                 its newline
//   //@ end       closes it
// Lines outside sections are notes for the reader and are not embedded; "//@" is allowed nowhere
// else. A placeholder @<name>@ stands for text the caller supplies (a number, a function name)
// through the second overload. embed_opencl.cmake checks the markers when it generates the table.
//
// Thread safety: the text is immutable static data; every function may be called from any thread.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace inferd::kernels {

// The text of `section` in kernels/opencl/`file` (e.g. "norm.cl"); asserts that it exists. The view
// is of static storage and NUL-terminated, so data() may be passed where a C string is wanted.
std::string_view opencl_section(std::string_view file, std::string_view section);

// The same text with every placeholder @name@ replaced by the value paired with name. Asserts that
// each placeholder of the text has a value and each value is used.
std::string opencl_section(std::string_view file, std::string_view section,
                           std::initializer_list<std::pair<std::string_view, std::string_view>> values);

}  // namespace inferd::kernels
