// inferd/status.h — error values for expected failures.
//
// Three kinds of failure, three tools (see ../shared/STYLE.md):
//   * a bug in this code            -> INFERD_ASSERT (aborts with the values involved);
//   * an expected failure           -> a Status / Result<T> whose Code tells the caller what to do;
//   * bad input from a file/client  -> a Status with kInvalidArgument or kCorrupt, never an abort.
//
// A successful Status costs one pointer-sized word and no allocation.
// Thread safety: values; no shared state.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <variant>

namespace inferd {

// What the caller can do about a failure (after kj::Exception::Type and absl::StatusCode).
enum class Code : int {
  kOk = 0,
  kInvalidArgument,   // the caller's request is malformed: fix the request
  kNotFound,          // a file, model or id does not exist
  kCorrupt,           // a file or message is malformed: the data is bad, not the request
  kOutOfRange,        // e.g. a prompt longer than the context
  kUnimplemented,     // a feature this build or model does not support
  kOverloaded,        // back off and retry later
  kDisconnected,      // the peer went away: reconnect / retry
  kFailed,            // anything else that failed at run time (I/O errors, resources)
};

const char* code_name(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(Code code, std::string message);

  static Status ok() { return Status(); }

  bool is_ok() const { return rep_ == nullptr; }
  explicit operator bool() const { return is_ok(); }
  Code code() const { return rep_ ? rep_->code : Code::kOk; }
  const std::string& message() const;
  // "CODE: message", or "OK".
  std::string to_string() const;

  // Returns a copy with `context + ": "` prepended to the message (code unchanged).
  Status with_context(const std::string& context) const;

 private:
  struct Rep {
    Code code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;
};

template <typename... Args>
Status make_error(Code code, const char* fmt, Args... args) {
  char buf[1024];
  if constexpr (sizeof...(Args) == 0) {
    std::snprintf(buf, sizeof(buf), "%s", fmt);
  } else {
    std::snprintf(buf, sizeof(buf), fmt, args...);
  }
  return Status(code, buf);
}

// kFailed with "what: <strerror(errno)>", for a system call that just failed. Read errno before any
// other call can change it (this function reads it first).
Status errno_error(const std::string& what);

// Result<T>: either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).is_ok()) v_ = Status(Code::kFailed, "Result constructed from an OK status");
  }

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOkStatus;
    return is_ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

// Prints the expression, where, and the printf-style message with its values (the operands), then aborts.
[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

}  // namespace inferd

// A bug in this code: print the expression, where, and an optional printf-style message with the values
// involved, then abort: INFERD_ASSERT(a == b, "a %d, b %d", a, b).
#define INFERD_ASSERT(cond, ...)                                                       \
  do {                                                                                 \
    if (__builtin_expect(!(cond), 0)) ::inferd::assert_fail(#cond, __FILE__, __LINE__, \
                                                            " " __VA_ARGS__);           \
  } while (0)

// Propagate a non-OK Status from an expression returning Status.
#define INFERD_RETURN_IF_ERROR(expr)            \
  do {                                          \
    ::inferd::Status inferd_status_ = (expr);   \
    if (!inferd_status_.is_ok()) return inferd_status_; \
  } while (0)
