#include "sd_notify.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace inferd::daemon::systemd {
namespace {

// The first descriptor systemd passes (SD_LISTEN_FDS_START).
constexpr int kListenFdsStart = 3;
// More than this many passed descriptors means a corrupt variable, not a real unit.
constexpr uint64_t kMaxListenFds = 4096;

// A strictly decimal, unsigned environment value; nullopt when unset, empty, signed or trailed by
// anything.
std::optional<uint64_t> env_u64(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  const std::string_view s(value);
  uint64_t v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

bool is_our_pid(uint64_t pid) { return pid == static_cast<uint64_t>(::getpid()); }

}  // namespace

bool notify(std::string_view state) {
  const char* env = std::getenv("NOTIFY_SOCKET");
  if (env == nullptr || state.empty()) return false;
  const std::string_view name(env);
  // A path, or an abstract name written "@name" (its first byte is NUL on the wire). Anything else
  // (e.g. systemd 253's "vsock:" addresses) is not for a local daemon.
  if (name.size() < 2 || (name.front() != '/' && name.front() != '@')) return false;

  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (name.size() > sizeof(addr.sun_path)) return false;
  std::memcpy(addr.sun_path, name.data(), name.size());
  if (name.front() == '@') addr.sun_path[0] = '\0';
  // An abstract name is exactly its bytes (no terminating NUL); a path may omit the NUL only when it
  // fills sun_path, which the length below allows.
  const auto addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());

  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  ssize_t sent;
  do {
    // MSG_NOSIGNAL: a datagram socket raises no SIGPIPE, but be explicit in a daemon.
    sent = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&addr),
                    addr_len);
  } while (sent < 0 && errno == EINTR);
  ::close(fd);
  return sent == static_cast<ssize_t>(state.size());
}

std::optional<std::chrono::microseconds> watchdog_interval() {
  const std::optional<uint64_t> usec = env_u64("WATCHDOG_USEC");
  if (!usec || *usec == 0 || *usec > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
  if (std::getenv("WATCHDOG_PID") != nullptr) {
    const std::optional<uint64_t> pid = env_u64("WATCHDOG_PID");
    if (!pid || !is_our_pid(*pid)) return std::nullopt;
  }
  return std::chrono::microseconds(static_cast<int64_t>(*usec));
}

std::vector<int> listen_fds() {
  const std::optional<uint64_t> pid = env_u64("LISTEN_PID");
  const std::optional<uint64_t> count = env_u64("LISTEN_FDS");
  ::unsetenv("LISTEN_PID");
  ::unsetenv("LISTEN_FDS");
  ::unsetenv("LISTEN_FDNAMES");
  if (!pid || !is_our_pid(*pid) || !count || *count > kMaxListenFds) return {};

  std::vector<int> fds;
  for (int fd = kListenFdsStart; fd < kListenFdsStart + static_cast<int>(*count); ++fd) {
    const int flags = ::fcntl(fd, F_GETFD);
    if (flags < 0) return {};  // not open: the variables lie; trust none of them
    if ((flags & FD_CLOEXEC) == 0 && ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC) < 0) return {};
    fds.push_back(fd);
  }
  return fds;
}

bool is_unix_stream_listener(int fd) {
  int type = 0, listening = 0;
  socklen_t len = sizeof(type);
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) return false;
  len = sizeof(listening);
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || listening == 0) return false;
  sockaddr_storage addr{};
  len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return false;
  return addr.ss_family == AF_UNIX;
}

}  // namespace inferd::daemon::systemd
