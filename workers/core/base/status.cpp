#include "inferd/status.h"

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace inferd {

const char* code_name(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: return "INVALID_ARGUMENT";
    case Code::kNotFound: return "NOT_FOUND";
    case Code::kCorrupt: return "CORRUPT";
    case Code::kOutOfRange: return "OUT_OF_RANGE";
    case Code::kUnimplemented: return "UNIMPLEMENTED";
    case Code::kOverloaded: return "OVERLOADED";
    case Code::kDisconnected: return "DISCONNECTED";
    case Code::kFailed: return "FAILED";
  }
  return "UNKNOWN";
}

Status::Status(Code code, std::string message) {
  if (code != Code::kOk) rep_ = std::make_shared<const Rep>(Rep{code, std::move(message)});
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

std::string Status::to_string() const {
  if (is_ok()) return "OK";
  return std::string(code_name(rep_->code)) + ": " + rep_->message;
}

Status Status::with_context(const std::string& context) const {
  if (is_ok()) return *this;
  return Status(rep_->code, context + ": " + rep_->message);
}

void assert_fail(const char* expr, const char* file, int line, const char* fmt, ...) {
  std::fprintf(stderr, "inferd: assertion failed: %s at %s:%d", expr, file, line);
  va_list args;
  va_start(args, fmt);
  std::vfprintf(stderr, fmt, args);
  va_end(args);
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::abort();
}

Status errno_error(const std::string& what) {
  const int err = errno;
  return Status(Code::kFailed, what + ": " + std::strerror(err));
}

}  // namespace inferd
