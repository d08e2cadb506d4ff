#include "cli.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace inferd::cli {

Parser::Parser(std::string program, std::string summary) : program_(std::move(program)), summary_(std::move(summary)) {
  flag({"-h", "--help"}, &help_, "show this help");
}

void Parser::add(std::vector<std::string> names, Kind kind, void* dst, std::string metavar, std::string help) {
  Opt o{std::move(names), kind, dst, std::move(metavar), std::move(help), ""};
  switch (kind) {
    case Kind::kString: o.default_text = *static_cast<std::string*>(dst); break;
    case Kind::kI32: o.default_text = std::to_string(*static_cast<int32_t*>(dst)); break;
    case Kind::kI64: o.default_text = std::to_string(*static_cast<int64_t*>(dst)); break;
    case Kind::kU64: o.default_text = std::to_string(*static_cast<uint64_t*>(dst)); break;
    case Kind::kF32: {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(*static_cast<float*>(dst)));
      o.default_text = buf;
      break;
    }
    case Kind::kFlag: break;
  }
  opts_.push_back(std::move(o));
}

void Parser::flag(std::vector<std::string> names, bool* dst, std::string help) {
  add(std::move(names), Kind::kFlag, dst, "", std::move(help));
}
void Parser::option(std::vector<std::string> names, std::string* dst, std::string metavar, std::string help) {
  add(std::move(names), Kind::kString, dst, std::move(metavar), std::move(help));
}
void Parser::option(std::vector<std::string> names, int32_t* dst, std::string metavar, std::string help) {
  add(std::move(names), Kind::kI32, dst, std::move(metavar), std::move(help));
}
void Parser::option(std::vector<std::string> names, int64_t* dst, std::string metavar, std::string help) {
  add(std::move(names), Kind::kI64, dst, std::move(metavar), std::move(help));
}
void Parser::option(std::vector<std::string> names, uint64_t* dst, std::string metavar, std::string help) {
  add(std::move(names), Kind::kU64, dst, std::move(metavar), std::move(help));
}
void Parser::option(std::vector<std::string> names, float* dst, std::string metavar, std::string help) {
  add(std::move(names), Kind::kF32, dst, std::move(metavar), std::move(help));
}

Status Parser::store(const Opt& opt, const std::string& name, const std::string& value) {
  errno = 0;
  char* end = nullptr;
  const char* s = value.c_str();
  auto bad = [&](const char* what) {
    return make_error(Code::kInvalidArgument, "%s expects %s, got '%s'", name.c_str(), what, s);
  };
  switch (opt.kind) {
    case Kind::kString: *static_cast<std::string*>(opt.dst) = value; return Status::ok();
    case Kind::kI32: {
      long long v = std::strtoll(s, &end, 10);
      if (*s == '\0' || *end != '\0' || errno != 0 || v < std::numeric_limits<int32_t>::min() ||
          v > std::numeric_limits<int32_t>::max()) {
        return bad("an integer");
      }
      *static_cast<int32_t*>(opt.dst) = static_cast<int32_t>(v);
      return Status::ok();
    }
    case Kind::kI64: {
      long long v = std::strtoll(s, &end, 10);
      if (*s == '\0' || *end != '\0' || errno != 0) return bad("an integer");
      *static_cast<int64_t*>(opt.dst) = v;
      return Status::ok();
    }
    case Kind::kU64: {
      unsigned long long v = std::strtoull(s, &end, 10);
      if (*s == '\0' || *s == '-' || *end != '\0' || errno != 0) return bad("a non-negative integer");
      *static_cast<uint64_t*>(opt.dst) = v;
      return Status::ok();
    }
    case Kind::kF32: {
      float v = std::strtof(s, &end);
      if (*s == '\0' || *end != '\0' || errno != 0 || !std::isfinite(v)) return bad("a finite number");
      *static_cast<float*>(opt.dst) = v;
      return Status::ok();
    }
    case Kind::kFlag: break;
  }
  return Status::ok();
}

Status Parser::parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    bool has_value = false;
    if (arg.rfind("--", 0) == 0) {
      const size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
        has_value = true;
      }
    }
    const Opt* found = nullptr;
    for (const Opt& o : opts_) {
      for (const std::string& n : o.names) {
        if (n == arg) found = &o;
      }
    }
    if (found == nullptr) return make_error(Code::kInvalidArgument, "unknown option '%s' (see --help)", arg.c_str());
    if (found->kind == Kind::kFlag) {
      if (has_value) return make_error(Code::kInvalidArgument, "%s takes no value", arg.c_str());
      *static_cast<bool*>(found->dst) = true;
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) return make_error(Code::kInvalidArgument, "%s needs a value", arg.c_str());
      value = argv[++i];
    }
    INFERD_RETURN_IF_ERROR(store(*found, arg, value));
  }
  return Status::ok();
}

std::string Parser::usage() const {
  std::string out = "usage: " + program_ + " [options]\n" + summary_ + "\n\noptions:\n";
  for (const Opt& o : opts_) {
    std::string names;
    for (const std::string& n : o.names) names += (names.empty() ? "" : ", ") + n;
    if (!o.metavar.empty()) names += " " + o.metavar;
    char line[512];
    std::snprintf(line, sizeof(line), "  %-28s %s", names.c_str(), o.help.c_str());
    out += line;
    if (!o.default_text.empty()) out += " (default: " + o.default_text + ")";
    out += "\n";
  }
  return out;
}

std::string default_model_path() {
  if (const char* env = std::getenv("INFERD_MODEL"); env != nullptr && *env != '\0') return env;
  return "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

int parse_or_exit(Parser& parser, int argc, char** argv) {
  Status s = parser.parse(argc, argv);
  if (!s.is_ok()) {
    std::fprintf(stderr, "error: %s\n", s.message().c_str());
    return 2;
  }
  if (parser.help_requested()) {
    std::fputs(parser.usage().c_str(), stdout);
    return 0;
  }
  return -1;
}

}  // namespace inferd::cli
