// inferd-gguf — validates a GGUF file and prints its header, metadata and tensor table.
//
//   inferd-gguf FILE [--tensors] [--json]
//
// Exit status: 0 when the file is valid, 1 when it is not (the error goes to stderr), 2 on bad usage.

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <string_view>

#include "inferd/gguf.h"

namespace {

using inferd::gguf::GgufFile;
using inferd::gguf::TensorInfo;
using inferd::gguf::ValueType;

constexpr size_t kDisplayLen = 72;  // metadata values longer than this are abbreviated

// JSON string literal; bytes that are not valid UTF-8 become U+FFFD so the output always parses.
std::string json_string(std::string_view s) {
  std::string out = "\"";
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
      ++i;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
      ++i;
    } else if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
    } else {
      size_t len = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
      bool ok = len != 0 && i + len <= s.size();
      for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
      if (ok) {
        out.append(s.substr(i, len));
        i += len;
      } else {
        out += "\\ufffd";
        ++i;
      }
    }
  }
  return out + "\"";
}

std::string shape_string(const TensorInfo& t) {
  std::string s = "[";
  for (int d = 0; d < t.n_dims; ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
  return s + "]";
}

std::string type_string(const GgufFile& f, const std::string& key) {
  ValueType t = f.type_of(key);
  if (t != ValueType::kArray) return inferd::gguf::value_type_name(t);
  auto info = f.get_array_info(key).value();
  return std::string("array[") + inferd::gguf::value_type_name(info.elem_type) + ", " +
         std::to_string(info.count) + "]";
}

double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

struct TypeTotals {
  int count = 0;
  uint64_t bytes = 0;
  int64_t elements = 0;
};

std::map<std::string, TypeTotals> totals_by_type(const GgufFile& f, uint64_t* total_bytes) {
  std::map<std::string, TypeTotals> by_type;
  *total_bytes = 0;
  for (const TensorInfo& t : f.tensors()) {
    TypeTotals& tt = by_type[inferd::dtype_name(t.type)];
    ++tt.count;
    tt.bytes += t.nbytes;
    tt.elements += t.n_elements();
    *total_bytes += t.nbytes;
  }
  return by_type;
}

void print_text(const GgufFile& f, bool tensors) {
  std::printf("file:         %s\n", f.path().c_str());
  std::printf("version:      %" PRIu32 "\n", f.version());
  std::printf("alignment:    %zu\n", f.alignment());
  std::printf("file size:    %zu bytes (%.2f MiB)\n", f.file_size(), mib(f.file_size()));
  std::printf("data offset:  %zu\n", f.data_offset());
  auto keys = f.keys();
  std::printf("\nmetadata: %zu keys\n", keys.size());
  size_t width = 0;
  for (const auto& k : keys) width = std::max(width, k.size());
  for (const auto& k : keys) {
    std::printf("  %-*s  %-20s %s\n", static_cast<int>(width), k.c_str(), type_string(f, k).c_str(),
                f.value_to_string(k, kDisplayLen).c_str());
  }

  uint64_t total = 0;
  auto by_type = totals_by_type(f, &total);
  std::printf("\ntensors: %zu\n", f.tensors().size());
  std::printf("  %-6s %6s %14s %12s %14s\n", "type", "count", "elements", "MiB", "bytes");
  for (const auto& [name, tt] : by_type) {
    std::printf("  %-6s %6d %14" PRId64 " %12.2f %14" PRIu64 "\n", name.c_str(), tt.count, tt.elements,
                mib(tt.bytes), tt.bytes);
  }
  std::printf("  %-6s %6zu %14s %12.2f %14" PRIu64 "\n", "total", f.tensors().size(), "", mib(total), total);

  if (tensors) {
    size_t name_width = 4;
    for (const TensorInfo& t : f.tensors()) name_width = std::max(name_width, t.name.size());
    std::printf("\n  %5s  %-*s  %-5s %-22s %12s %12s\n", "#", static_cast<int>(name_width), "name", "type",
                "shape", "offset", "bytes");
    size_t i = 0;
    for (const TensorInfo& t : f.tensors()) {
      std::printf("  %5zu  %-*s  %-5s %-22s %12" PRIu64 " %12zu\n", i++, static_cast<int>(name_width),
                  t.name.c_str(), inferd::dtype_name(t.type), shape_string(t).c_str(), t.offset, t.nbytes);
    }
  }
}

// A scalar as a JSON value; arrays as {"elem_type", "count", "preview"}.
std::string json_value(const GgufFile& f, const std::string& key) {
  switch (f.type_of(key)) {
    case ValueType::kString:
      return json_string(f.get_string(key).value());
    case ValueType::kBool:
      return f.get_bool(key).value() ? "true" : "false";
    case ValueType::kF32:
    case ValueType::kF64: {
      std::string s = f.value_to_string(key);
      // JSON has no NaN or infinity.
      return s.find_first_of("ni") != std::string::npos ? json_string(s) : s;
    }
    case ValueType::kArray: {
      auto info = f.get_array_info(key).value();
      return std::string("{\"elem_type\": \"") + inferd::gguf::value_type_name(info.elem_type) +
             "\", \"count\": " + std::to_string(info.count) +
             ", \"preview\": " + json_string(f.value_to_string(key, kDisplayLen)) + "}";
    }
    default:
      return f.value_to_string(key);  // an integer
  }
}

void print_json(const GgufFile& f, bool tensors) {
  std::printf("{\n  \"file\": %s,\n", json_string(f.path()).c_str());
  std::printf("  \"version\": %" PRIu32 ",\n  \"alignment\": %zu,\n", f.version(), f.alignment());
  std::printf("  \"file_size\": %zu,\n  \"data_offset\": %zu,\n", f.file_size(), f.data_offset());
  std::printf("  \"metadata\": [");
  auto keys = f.keys();
  for (size_t i = 0; i < keys.size(); ++i) {
    std::printf("%s\n    {\"key\": %s, \"type\": \"%s\", \"value\": %s}", i ? "," : "",
                json_string(keys[i]).c_str(), inferd::gguf::value_type_name(f.type_of(keys[i])),
                json_value(f, keys[i]).c_str());
  }
  std::printf("\n  ],\n");
  uint64_t total = 0;
  auto by_type = totals_by_type(f, &total);
  std::printf("  \"tensor_count\": %zu,\n  \"tensor_bytes\": %" PRIu64 ",\n  \"tensor_types\": {",
              f.tensors().size(), total);
  bool first = true;
  for (const auto& [name, tt] : by_type) {
    std::printf("%s\n    \"%s\": {\"count\": %d, \"elements\": %" PRId64 ", \"bytes\": %" PRIu64 "}",
                first ? "" : ",", name.c_str(), tt.count, tt.elements, tt.bytes);
    first = false;
  }
  std::printf("\n  }");
  if (tensors) {
    std::printf(",\n  \"tensors\": [");
    size_t i = 0;
    for (const TensorInfo& t : f.tensors()) {
      std::printf("%s\n    {\"name\": %s, \"type\": \"%s\", \"shape\": %s, \"offset\": %" PRIu64
                  ", \"bytes\": %zu}",
                  i++ ? "," : "", json_string(t.name).c_str(), inferd::dtype_name(t.type),
                  shape_string(t).c_str(), t.offset, t.nbytes);
    }
    std::printf("\n  ]");
  }
  std::printf("\n}\n");
}

int usage() {
  std::fprintf(stderr, "usage: inferd-gguf FILE [--tensors] [--json]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const char* path = nullptr;
  bool tensors = false, json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--tensors") == 0) {
      tensors = true;
    } else if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
      usage();
      return 0;
    } else if (argv[i][0] == '-' || path != nullptr) {
      return usage();
    } else {
      path = argv[i];
    }
  }
  if (path == nullptr) return usage();

  auto file = GgufFile::open(path);
  if (!file.is_ok()) {
    std::fprintf(stderr, "inferd-gguf: %s\n", file.status().to_string().c_str());
    return 1;
  }
  if (json) {
    print_json(*file.value(), tensors);
  } else {
    print_text(*file.value(), tensors);
  }
  return 0;
}
