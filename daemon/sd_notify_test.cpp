#include "sd_notify.h"
#include "inferd/testing/scoped_env.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace inferd::daemon::systemd {
namespace {

using inferd::testing::ScopedEnv;

// A receiving notify socket bound at a path or an abstract name ("@..."), as systemd's.
class Receiver {
 public:
  explicit Receiver(const std::string& name) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd_, 0) << std::strerror(errno);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, name.data(), name.size());
    if (name.front() == '@') addr.sun_path[0] = '\0';
    const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
    bound_ = ::bind(fd_, reinterpret_cast<const sockaddr*>(&addr), len) == 0;
    EXPECT_TRUE(bound_) << name << ": " << std::strerror(errno);
    // systemd checks the sender's pid (NotifyAccess=main) from these credentials.
    const int one = 1;
    EXPECT_EQ(::setsockopt(fd_, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)), 0);
  }
  ~Receiver() { ::close(fd_); }
  Receiver(const Receiver&) = delete;
  Receiver& operator=(const Receiver&) = delete;

  // The datagram already queued (a unix datagram is queued before sendto() returns, so no waiting),
  // or nullopt; `sender_pid` gets the sender's pid from its credentials.
  std::optional<std::string> take(pid_t* sender_pid) {
    char data[4096];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred))];
    iovec iov{data, sizeof(data)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd_, &msg, MSG_DONTWAIT);
    if (n < 0) return std::nullopt;
    *sender_pid = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
        ucred cred{};
        std::memcpy(&cred, CMSG_DATA(c), sizeof(cred));
        *sender_pid = cred.pid;
      }
    }
    return std::string(data, static_cast<size_t>(n));
  }

  bool bound() const { return bound_; }

 private:
  int fd_ = -1;
  bool bound_ = false;
};

int open_fd_count() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

class SdNotifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = ::testing::TempDir() + "inferd-sd-XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  ScopedEnv notify_env_{"NOTIFY_SOCKET", std::nullopt};
};

TEST_F(SdNotifyTest, NotifyWithoutSocketIsANoOp) {
  EXPECT_FALSE(notify("READY=1"));
  ScopedEnv empty("NOTIFY_SOCKET", "");
  EXPECT_FALSE(notify("READY=1"));
}

TEST_F(SdNotifyTest, NotifySendsOneDatagramToPathSocket) {
  const std::string path = dir_ + "/notify.sock";
  Receiver receiver(path);
  ASSERT_TRUE(receiver.bound());
  ScopedEnv env("NOTIFY_SOCKET", path);

  const int fds_before = open_fd_count();
  ASSERT_TRUE(notify("READY=1\nSTATUS=serving 2 models"));
  EXPECT_EQ(open_fd_count(), fds_before);  // the sending socket is closed again
  ASSERT_TRUE(notify("WATCHDOG=1"));

  pid_t pid = 0;
  EXPECT_EQ(receiver.take(&pid), "READY=1\nSTATUS=serving 2 models");
  EXPECT_EQ(pid, ::getpid());
  EXPECT_EQ(receiver.take(&pid), "WATCHDOG=1");
  EXPECT_EQ(receiver.take(&pid), std::nullopt);  // nothing else was sent
}

TEST_F(SdNotifyTest, NotifySendsToAbstractSocket) {
  const std::string name = "@inferd-sd-notify-test-" + std::to_string(::getpid());
  Receiver receiver(name);
  ASSERT_TRUE(receiver.bound());
  ScopedEnv env("NOTIFY_SOCKET", name);
  ASSERT_TRUE(notify("STOPPING=1"));
  pid_t pid = 0;
  EXPECT_EQ(receiver.take(&pid), "STOPPING=1");
  EXPECT_EQ(pid, ::getpid());
}

TEST_F(SdNotifyTest, NotifyFailsQuietlyWhenUnreachableOrMalformed) {
  {
    ScopedEnv env("NOTIFY_SOCKET", dir_ + "/nobody-listens.sock");
    EXPECT_FALSE(notify("READY=1"));
  }
  const std::vector<std::string> bad_names = {"relative.sock", "@", "/", "vsock:2:1234",
                                              "/" + std::string(200, 'x')};
  for (const std::string& bad : bad_names) {
    ScopedEnv env("NOTIFY_SOCKET", bad);
    EXPECT_FALSE(notify("READY=1")) << bad;
  }
}

TEST_F(SdNotifyTest, WatchdogInterval) {
  ScopedEnv pid_env("WATCHDOG_PID", std::nullopt);
  {
    ScopedEnv usec("WATCHDOG_USEC", std::nullopt);
    EXPECT_EQ(watchdog_interval(), std::nullopt);
  }
  ScopedEnv usec("WATCHDOG_USEC", "30000000");
  EXPECT_EQ(watchdog_interval(), std::chrono::microseconds(30'000'000));
  {
    ScopedEnv pid("WATCHDOG_PID", std::to_string(::getpid()));
    EXPECT_EQ(watchdog_interval(), std::chrono::seconds(30));
  }
  {
    ScopedEnv pid("WATCHDOG_PID", std::to_string(::getpid() + 1));  // meant for another process
    EXPECT_EQ(watchdog_interval(), std::nullopt);
  }
  {
    ScopedEnv pid("WATCHDOG_PID", "self");
    EXPECT_EQ(watchdog_interval(), std::nullopt);
  }
  for (const char* bad : {"0", "", "-5", "30s", "1e6", "99999999999999999999999"}) {
    ScopedEnv bad_usec("WATCHDOG_USEC", bad);
    EXPECT_EQ(watchdog_interval(), std::nullopt) << bad;
  }
}

TEST_F(SdNotifyTest, ListenFdsForAnotherProcessReturnsNothingAndClearsEnvironment) {
  ScopedEnv pid("LISTEN_PID", std::to_string(::getpid() + 1));
  ScopedEnv fds("LISTEN_FDS", "2");
  ScopedEnv names("LISTEN_FDNAMES", "a:b");
  EXPECT_TRUE(listen_fds().empty());
  EXPECT_EQ(std::getenv("LISTEN_PID"), nullptr);
  EXPECT_EQ(std::getenv("LISTEN_FDS"), nullptr);
  EXPECT_EQ(std::getenv("LISTEN_FDNAMES"), nullptr);
}

TEST_F(SdNotifyTest, ListenFdsWithoutVariablesReturnsNothing) {
  ScopedEnv pid("LISTEN_PID", std::nullopt);
  ScopedEnv fds("LISTEN_FDS", std::nullopt);
  EXPECT_TRUE(listen_fds().empty());
}

// What a forked child found; its exit code.
enum ChildResult : int {
  kChildOk = 0,
  kChildSetupFailed = 10,
  kChildWrongFds = 11,
  kChildNotCloexec = 12,
  kChildEnvLeft = 13,
  kChildNotListener = 14,
  kChildUnexpectedFds = 15,
};

// Runs `body` in a forked child and returns its exit code (or 100 + signal).
template <typename Body>
int run_in_child(Body body) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(body());
  EXPECT_GT(child, 0) << std::strerror(errno);
  int status = 0;
  EXPECT_EQ(::waitpid(child, &status, 0), child);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

// Places `fd` at `target` without FD_CLOEXEC, as systemd passes it.
bool place_fd(int fd, int target) {
  return ::dup2(fd, target) == target && ::fcntl(target, F_SETFD, 0) == 0;
}

TEST_F(SdNotifyTest, ListenFdsTakesPassedSocketsInChild) {
  const std::string path = dir_ + "/listen.sock";
  const int code = run_in_child([&path]() -> int {
    // A real listening unix socket and one end of a socketpair, first moved above the target range
    // so that dup2 never overwrites one with the other.
    const int listener = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    if (listener < 0 || ::bind(listener, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(listener, 4) != 0) {
      return kChildSetupFailed;
    }
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) return kChildSetupFailed;
    const int high_listener = ::fcntl(listener, F_DUPFD, 100);
    const int high_pair = ::fcntl(pair[0], F_DUPFD, 100);
    if (high_listener < 0 || high_pair < 0 || !place_fd(high_listener, 3) || !place_fd(high_pair, 4)) {
      return kChildSetupFailed;
    }
    ::setenv("LISTEN_PID", std::to_string(::getpid()).c_str(), 1);
    ::setenv("LISTEN_FDS", "2", 1);
    ::setenv("LISTEN_FDNAMES", "inferd.socket:other", 1);

    const std::vector<int> fds = listen_fds();
    if (fds != std::vector<int>{3, 4}) return kChildWrongFds;
    for (int fd : fds) {
      if ((::fcntl(fd, F_GETFD) & FD_CLOEXEC) == 0) return kChildNotCloexec;
    }
    if (std::getenv("LISTEN_PID") || std::getenv("LISTEN_FDS") || std::getenv("LISTEN_FDNAMES")) {
      return kChildEnvLeft;
    }
    if (!is_unix_stream_listener(3) || is_unix_stream_listener(4)) return kChildNotListener;
    if (!listen_fds().empty()) return kChildUnexpectedFds;  // the variables are consumed
    return kChildOk;
  });
  EXPECT_EQ(code, kChildOk);
}

TEST_F(SdNotifyTest, ListenFdsRejectsClosedDescriptorsInChild) {
  const int code = run_in_child([]() -> int {
    ::close(3);
    ::setenv("LISTEN_PID", std::to_string(::getpid()).c_str(), 1);
    ::setenv("LISTEN_FDS", "1", 1);
    return listen_fds().empty() ? kChildOk : kChildUnexpectedFds;
  });
  EXPECT_EQ(code, kChildOk);
}

TEST_F(SdNotifyTest, ListenFdsRejectsMalformedCountInChild) {
  for (const char* count : {"", "two", "-1", "99999999999"}) {
    const int code = run_in_child([count]() -> int {
      ::setenv("LISTEN_PID", std::to_string(::getpid()).c_str(), 1);
      ::setenv("LISTEN_FDS", count, 1);
      return listen_fds().empty() ? kChildOk : kChildUnexpectedFds;
    });
    EXPECT_EQ(code, kChildOk) << count;
  }
}

TEST(SdNotifySocketKindTest, OnlyListeningUnixStreamSocketsQualify) {
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  EXPECT_FALSE(is_unix_stream_listener(pair[0]));  // connected, not listening
  const int dgram = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  EXPECT_FALSE(is_unix_stream_listener(dgram));
  const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  // Binding with only the address family autobinds to a fresh abstract name (unix(7)).
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_EQ(::bind(listener, reinterpret_cast<const sockaddr*>(&addr), sizeof(sa_family_t)), 0);
  EXPECT_FALSE(is_unix_stream_listener(listener));  // bound, not yet listening
  ASSERT_EQ(::listen(listener, 1), 0);
  EXPECT_TRUE(is_unix_stream_listener(listener));
  EXPECT_FALSE(is_unix_stream_listener(-1));  // not a descriptor at all
  for (int fd : {pair[0], pair[1], dgram, listener}) ::close(fd);
}

}  // namespace
}  // namespace inferd::daemon::systemd
