#include "inferd/opencl/codegen.h"

#include <cctype>
#include <set>
#include <string_view>

namespace inferd::opencl {
namespace {

constexpr std::string_view kSamplerName = "inferd_smp";

bool is_ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }

bool is_identifier(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0])) != 0) return false;
  for (char c : s) {
    if (!is_ident_char(c)) return false;
  }
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())) != 0) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())) != 0) s.remove_suffix(1);
  return s;
}

// An argument as it is substituted: bare when it is one token (a name or a number), else in parentheses.
std::string paren(const std::string& arg) {
  for (char c : arg) {
    if (!is_ident_char(c) && c != '.') return "(" + arg + ")";
  }
  return arg;
}

class Expander {
 public:
  explicit Expander(const KernelTemplate& kernel) : kernel_(kernel) {}

  // Rewrites every accessor in `text`; `base` is text's offset in the body (for messages).
  Result<std::string> expand(std::string_view text, size_t base) {
    std::string out;
    size_t i = 0;
    while (i < text.size()) {
      if (text[i] != '$') {
        out.push_back(text[i++]);
        continue;
      }
      const size_t start = i;
      size_t j = i + 1;
      while (j < text.size() && is_ident_char(text[j])) ++j;
      const std::string_view name = text.substr(i + 1, j - i - 1);
      const TensorParam* tensor = find(name);
      if (tensor == nullptr) return error(base + start, "unknown tensor '$" + std::string(name) + "'");
      if (j >= text.size() || text[j] != '.') return error(base + j, "expected '.' after '$" + std::string(name) + "'");
      size_t k = j + 1;
      while (k < text.size() && is_ident_char(text[k])) ++k;
      const std::string method(text.substr(j + 1, k - j - 1));
      while (k < text.size() && std::isspace(static_cast<unsigned char>(text[k])) != 0) ++k;
      if (k >= text.size() || text[k] != '(') return error(base + k, "expected '(' after '." + method + "'");

      // The argument list up to the matching ')', split at top-level commas.
      std::vector<std::pair<std::string_view, size_t>> raw_args;  // (text, offset in `text`)
      int depth = 0;
      size_t arg_start = k + 1, end = std::string_view::npos;
      for (size_t p = k + 1; p < text.size(); ++p) {
        const char c = text[p];
        if (c == '(' || c == '[') {
          ++depth;
        } else if ((c == ')' || c == ']') && depth > 0) {
          --depth;
        } else if (c == ')' && depth == 0) {
          raw_args.emplace_back(text.substr(arg_start, p - arg_start), arg_start);
          end = p;
          break;
        } else if (c == ',' && depth == 0) {
          raw_args.emplace_back(text.substr(arg_start, p - arg_start), arg_start);
          arg_start = p + 1;
        }
      }
      if (end == std::string_view::npos) return error(base + start, "unterminated call of '$" + std::string(name) + "." + method + "'");
      if (raw_args.size() == 1 && trim(raw_args[0].first).empty()) raw_args.clear();

      std::vector<std::string> args;
      for (const auto& [arg, offset] : raw_args) {
        if (trim(arg).empty()) return error(base + offset, "empty argument");
        auto expanded = expand(arg, base + offset);
        if (!expanded) return expanded.status();
        args.emplace_back(trim(expanded.value()));
      }
      auto replacement = translate(*tensor, method, args, base + start);
      if (!replacement) return replacement.status();
      out += replacement.value();
      i = end + 1;
    }
    return out;
  }

  bool uses_sampler() const { return uses_sampler_; }
  bool writes_3d() const { return writes_3d_; }
  const std::set<int>& split_reads() const { return split_reads_; }
  const std::set<int>& split_writes() const { return split_writes_; }

 private:
  const TensorParam* find(std::string_view name) const {
    for (const TensorParam& t : kernel_.tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }

  Status error(size_t offset, const std::string& what) const {
    return Status(Code::kInvalidArgument,
                  "kernel " + kernel_.name + ": " + what + " at offset " + std::to_string(offset) + " of the body");
  }

  // The linear texel index of (x, y, s[, b]) in tensor `n`.
  static std::string linear_index(const std::string& n, const std::vector<std::string>& c) {
    std::string index = "((" + paren(c[2]) + "*" + n + "_h + " + paren(c[1]) + ")*" + n + "_w + " + paren(c[0]) + ")*" +
                        n + "_b";
    if (c.size() == 4) index += " + " + paren(c[3]);
    return index;
  }

  // A texture's column of (x, y, s[, b]): X*b + B (every texture storage interleaves the batch).
  static std::string texel_x(const std::string& n, const std::vector<std::string>& c) {
    std::string x = paren(c[0]) + "*" + n + "_b";
    if (c.size() == 4) x += " + " + paren(c[3]);
    return x;
  }

  static std::string texture_coord(const std::string& n, const std::vector<std::string>& c) {
    return "(int2)(" + texel_x(n, c) + ", " + paren(c[1]) + "*" + n + "_s + " + paren(c[2]) + ")";
  }

  // The split texture's accessor call: its parts, the slices per part, then x*b + B, y, s.
  std::string split_call(const char* verb, const TensorParam& t, const std::vector<std::string>& c) {
    const std::string& n = t.name;
    const int parts = t.format.parts;
    (verb[0] == 'r' ? split_reads_ : split_writes_).insert(parts);
    std::string call = std::string("inferd_") + verb + "_split" + std::to_string(parts) + "(";
    for (int p = 0; p < parts; ++p) call += n + "_" + std::to_string(p) + ", ";
    return call + "(" + n + "_s + " + std::to_string(parts - 1) + ") / " + std::to_string(parts) + ", " +
           texel_x(n, c) + ", " + paren(c[1]) + ", " + paren(c[2]);
  }

  static std::string texture3d_coord(const std::string& n, const std::vector<std::string>& c) {
    return "(int4)(" + texel_x(n, c) + ", " + paren(c[1]) + ", " + paren(c[2]) + ", 0)";
  }

  Result<std::string> translate(const TensorParam& t, const std::string& method, const std::vector<std::string>& args,
                                size_t offset) {
    const std::string& n = t.name;
    struct Extent {
      const char* method;
      const char* suffix;
    };
    static constexpr Extent kExtents[] = {
        {"Width", "_w"}, {"Height", "_h"}, {"Slices", "_s"}, {"Batch", "_b"}, {"Channels", "_c"}};
    for (const Extent& e : kExtents) {
      if (method != e.method) continue;
      if (!args.empty()) return error(offset, "$" + n + "." + method + "() takes no arguments");
      return n + e.suffix;
    }
    if (method == "Read") {
      if (t.access != Access::kRead) return error(offset, "$" + n + " is write-only");
      if (args.size() != 3 && args.size() != 4) return error(offset, "$" + n + ".Read takes (x, y, s[, b])");
      const bool half = t.format.data_type == DataType::kFloat16;
      switch (t.format.storage) {
        case StorageType::kBuffer:
          return std::string(half ? "vload_half4(" : "vload4(") + linear_index(n, args) + ", " + n + ")";
        case StorageType::kImageBuffer: return "read_imagef(" + n + ", " + linear_index(n, args) + ")";
        case StorageType::kTexture2D:
          uses_sampler_ = true;
          return "read_imagef(" + n + ", " + std::string(kSamplerName) + ", " + texture_coord(n, args) + ")";
        case StorageType::kTexture3D:
          uses_sampler_ = true;
          return "read_imagef(" + n + ", " + std::string(kSamplerName) + ", " + texture3d_coord(n, args) + ")";
        case StorageType::kTexture2DSplit:
          uses_sampler_ = true;
          return split_call("read", t, args) + ")";
      }
    }
    if (method == "Write") {
      if (t.access != Access::kWrite) return error(offset, "$" + n + " is read-only");
      if (args.size() != 4 && args.size() != 5) return error(offset, "$" + n + ".Write takes (value, x, y, s[, b])");
      const std::vector<std::string> coords(args.begin() + 1, args.end());
      const bool half = t.format.data_type == DataType::kFloat16;
      switch (t.format.storage) {
        case StorageType::kBuffer:
          return std::string(half ? "vstore_half4_rte(" : "vstore4(") + args[0] + ", " + linear_index(n, coords) +
                 ", " + n + ")";
        case StorageType::kImageBuffer: return "write_imagef(" + n + ", " + linear_index(n, coords) + ", " + args[0] + ")";
        case StorageType::kTexture2D: return "write_imagef(" + n + ", " + texture_coord(n, coords) + ", " + args[0] + ")";
        case StorageType::kTexture3D:
          writes_3d_ = true;
          return "write_imagef(" + n + ", " + texture3d_coord(n, coords) + ", " + args[0] + ")";
        case StorageType::kTexture2DSplit: return split_call("write", t, coords) + ", " + args[0] + ")";
      }
    }
    return error(offset, "unknown method '$" + n + "." + method + "'");
  }

  const KernelTemplate& kernel_;
  bool uses_sampler_ = false;
  bool writes_3d_ = false;
  std::set<int> split_reads_, split_writes_;  // the part counts of the split textures read / written
};

// The accessors of split textures of `parts` parts: a part per band of `sp` slices.
std::string split_helpers(int parts, bool read) {
  std::string params;
  for (int p = 0; p < parts; ++p) {
    params += std::string(read ? "__read_only" : "__write_only") + " image2d_t i" + std::to_string(p) + ", ";
  }
  std::string f = read ? "inline float4 inferd_read_split" : "inline void inferd_write_split";
  f += std::to_string(parts) + "(" + params + "int sp, int x, int y, int s" + (read ? "" : ", float4 v") + ") {\n" +
       "  const int p = s / sp;\n  const int2 c = (int2)(x, y * sp + s - p * sp);\n";
  for (int p = 0; p < parts; ++p) {
    std::string i = "i";
    i += std::to_string(p);
    const std::string op = read ? "return read_imagef(" + i + ", " + std::string(kSamplerName) + ", c);"
                                : "write_imagef(" + i + ", c, v);";
    f += p + 1 < parts ? "  if (p == " + std::to_string(p) + ") {\n    " + op + (read ? "" : "\n    return;") + "\n  }\n"
                       : "  " + op + "\n";
  }
  return f + "}\n";
}

std::string declaration(const TensorParam& t) {
  const bool read = t.access == Access::kRead;
  const char* element = t.format.data_type == DataType::kFloat16 ? "half* " : "float* ";
  switch (t.format.storage) {
    case StorageType::kBuffer: return std::string(read ? "__global const " : "__global ") + element + t.name;
    case StorageType::kImageBuffer: return std::string(read ? "__read_only" : "__write_only") + " image1d_buffer_t " + t.name;
    case StorageType::kTexture2D: return std::string(read ? "__read_only" : "__write_only") + " image2d_t " + t.name;
    case StorageType::kTexture3D: return std::string(read ? "__read_only" : "__write_only") + " image3d_t " + t.name;
    case StorageType::kTexture2DSplit: {
      std::string parts;
      for (int p = 0; p < t.format.parts; ++p) {
        parts += std::string(p == 0 ? "" : ", ") + (read ? "__read_only" : "__write_only") + " image2d_t " + t.name + "_" +
                 std::to_string(p);
      }
      return parts;
    }
  }
  return "";
}

}  // namespace

Result<GeneratedKernel> generate_kernel(const KernelTemplate& kernel) {
  if (!is_identifier(kernel.name)) return Status(Code::kInvalidArgument, "bad kernel name '" + kernel.name + "'");
  for (size_t i = 0; i < kernel.tensors.size(); ++i) {
    const std::string& name = kernel.tensors[i].name;
    const int32_t parts = kernel.tensors[i].format.parts;
    if (parts < 1 || parts > kMaxTextureParts ||
        (parts > 1 && kernel.tensors[i].format.storage != StorageType::kTexture2DSplit)) {
      return Status(Code::kInvalidArgument,
                    "kernel " + kernel.name + ": tensor '" + name + "' in " + std::to_string(parts) + " parts");
    }
    if (!is_identifier(name) || name == kSamplerName) {
      return Status(Code::kInvalidArgument, "kernel " + kernel.name + ": bad tensor name '" + name + "'");
    }
    for (size_t j = 0; j < i; ++j) {
      if (kernel.tensors[j].name == name) {
        return Status(Code::kInvalidArgument, "kernel " + kernel.name + ": tensor '" + name + "' declared twice");
      }
    }
  }
  if (kernel.helpers.find('$') != std::string::npos) {
    return Status(Code::kInvalidArgument, "kernel " + kernel.name + ": accessors are not allowed in helpers");
  }
  Expander expander(kernel);
  auto body = expander.expand(kernel.body, 0);
  if (!body) return body.status();

  std::string src = "// Generated by inferd's OpenCL code generator: kernel " + kernel.name + ".\n// Tensors:";
  for (const TensorParam& t : kernel.tensors) {
    src += std::string(" ") + t.name + " (" + t.format.to_string() + ", " +
           (t.access == Access::kRead ? "read" : "write") + ")";
  }
  src += "\n";
  // a * b + c is two roundings unless a kernel writes fma(): OpenCL C otherwise lets the compiler
  // contract it, and the exact kernels (ops.h) reproduce the CPU engine's roundings one by one.
  src += "#pragma OPENCL FP_CONTRACT OFF\n";
  // OpenCL C 1.2 writes 3D images only through this extension (TensorDescriptor::fits checks it).
  if (expander.writes_3d()) src += "#pragma OPENCL EXTENSION cl_khr_3d_image_writes : enable\n";
  if (expander.uses_sampler()) {
    src += "__constant sampler_t " + std::string(kSamplerName) +
           " = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_NONE | CLK_FILTER_NEAREST;\n";
  }
  for (int parts : expander.split_reads()) src += split_helpers(parts, true);
  for (int parts : expander.split_writes()) src += split_helpers(parts, false);
  src += kernel.helpers;
  if (!kernel.helpers.empty() && kernel.helpers.back() != '\n') src += "\n";
  src += "__kernel void " + kernel.name + "(";
  bool first = true;
  auto add_param = [&](const std::string& p) {
    src += (first ? "\n    " : ",\n    ") + p;
    first = false;
  };
  for (const TensorParam& t : kernel.tensors) {
    const std::string& n = t.name;
    add_param(declaration(t) + ", int " + n + "_w, int " + n + "_h, int " + n + "_s, int " + n + "_b, int " + n + "_c");
  }
  for (const std::string& p : kernel.params) add_param(p);
  src += ") {\n" + body.value();
  if (!body.value().empty() && body.value().back() != '\n') src += "\n";
  src += "}\n";

  GeneratedKernel out;
  out.name = kernel.name;
  out.source = std::move(src);
  out.first_param_arg = 0;
  for (const TensorParam& t : kernel.tensors) out.first_param_arg += args_per_tensor(t.format);
  return out;
}

}  // namespace inferd::opencl
