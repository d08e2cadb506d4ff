// daemon/sd_notify.h — the daemon's side of systemd's service protocols, without libsystemd:
//   * sd_notify(3): readiness, status text, watchdog pings and stop notices sent as one datagram each
//     to the unix socket named by $NOTIFY_SOCKET (a path, or "@name" for an abstract socket);
//   * the watchdog: $WATCHDOG_USEC (and $WATCHDOG_PID) say how often systemd expects "WATCHDOG=1";
//   * socket activation, sd_listen_fds(3): $LISTEN_PID / $LISTEN_FDS name listening sockets passed as
//     file descriptors 3, 4, ...
// Outside systemd (variables unset) every function is a harmless no-op, so the daemon calls them
// unconditionally.
//
// Thread safety: these functions read the environment with getenv(), and listen_fds() changes it, so
// call listen_fds() once at start-up before any thread exists. After that notify() and
// watchdog_interval() may be called from any thread, provided nothing calls setenv/unsetenv.
#pragma once

#include <chrono>
#include <optional>
#include <string_view>
#include <vector>

namespace inferd::daemon::systemd {

// Sends `state` ("READY=1", "STATUS=loading llama-3", "WATCHDOG=1", "STOPPING=1", "RELOADING=1",
// "MAINPID=1234", or several such lines joined by '\n') to $NOTIFY_SOCKET. Returns true when the
// datagram was sent; false when $NOTIFY_SOCKET is unset, malformed or unreachable (systemd gone),
// which the daemon ignores: notifications are advisory.
bool notify(std::string_view state);

// The watchdog period systemd expects pings within, from $WATCHDOG_USEC; nullopt when no watchdog is
// configured, the value is malformed or 0, or $WATCHDOG_PID is set and names another process (the
// variables were inherited). Ping with notify("WATCHDOG=1") every half of it.
std::optional<std::chrono::microseconds> watchdog_interval();

// Socket activation: the listening sockets systemd passed, [3, 3 + $LISTEN_FDS), when $LISTEN_PID is
// this process; empty otherwise or when the variables are malformed or a descriptor is not open.
// Marks each returned descriptor close-on-exec (so workers do not inherit it) and removes LISTEN_PID,
// LISTEN_FDS and LISTEN_FDNAMES from the environment in every case, so that child processes never
// mistake them for their own. The caller owns the returned descriptors.
std::vector<int> listen_fds();

// True when `fd` is a listening (accept()ing) AF_UNIX SOCK_STREAM socket: what inferd.socket passes.
// Lets the daemon refuse a misconfigured socket unit with a clear message.
bool is_unix_stream_listener(int fd);

}  // namespace inferd::daemon::systemd
