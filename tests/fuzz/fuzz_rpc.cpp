// libFuzzer target: the daemon's two front ends fed raw bytes from a client — the Cap'n Proto RPC
// server (two-party protocol messages) and the HTTP server — through real unix sockets, with a real
// supervisor behind them (no model loaded; loads fail: the worker binary does not exist). Each input is
// one connection: its bytes are sent, the client's sending side closed, and the server must end the
// connection without crashing or hanging, whatever the bytes were.
//
// Input: the first byte picks the socket (even: RPC, odd: HTTP); the rest is what the client sends.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <kj/async-io.h>
#include <spdlog/spdlog.h>
#include <kj/async-unix.h>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "config.h"
#include "http_server.h"
#include "rpc_server.h"
#include "supervisor.h"

namespace {

struct Server {
  std::string dir, rpc_path, http_path;
};
const Server* instance = nullptr;

// Starts the daemon's servers on their own threads, once; they run until the process exits.
const Server& server() {
  static Server* s = [] {
    ::signal(SIGPIPE, SIG_IGN);
    auto* out = new Server;
    char tmpl[] = "/tmp/inferd-fuzz-rpc-XXXXXX";
    const char* dir = ::mkdtemp(tmpl);
    if (dir == nullptr) std::abort();
    out->dir = dir;
    out->rpc_path = out->dir + "/inferd.sock";
    out->http_path = out->dir + "/inferd-http.sock";
    std::atexit([] {  // the sockets and their directory go with the process
      const Server& s = *instance;
      ::unlink(s.rpc_path.c_str());
      ::unlink(s.http_path.c_str());
      ::rmdir(s.dir.c_str());
    });
    instance = out;
    std::thread([out] {
      using namespace inferd::daemon;
      spdlog::set_level(spdlog::level::off);
      auto io = kj::setupAsyncIo();
      DaemonConfig cfg;
      cfg.socket_path = out->rpc_path;
      cfg.worker_path = out->dir + "/no-such-worker";
      cfg.log_level = "off";
      auto* sup = new Supervisor(cfg);  // never destroyed: the servers run until the process exits
      std::thread([sup] { sup->run(); }).detach();
      auto rpc_fd = listen_unix(out->rpc_path);
      auto http_fd = listen_unix(out->http_path);
      if (!rpc_fd || !http_fd) std::abort();
      RpcServer rpc(*sup, *io.provider, *io.lowLevelProvider, rpc_fd.value());
      HttpServer http(*sup, io.provider->getTimer(), io.unixEventPort, {});
      auto serving = rpc.run().exclusiveJoin(http.listen(
          io.lowLevelProvider->wrapListenSocketFd(http_fd.value(), kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP), false));
      serving.wait(io.waitScope);
      std::abort();  // the accept loops never end
    }).detach();
    // Wait for both sockets to accept.
    for (const std::string* path : {&out->rpc_path, &out->http_path}) {
      for (int i = 0;; ++i) {
        int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::strncpy(addr.sun_path, path->c_str(), sizeof(addr.sun_path) - 1);
        const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
        ::close(fd);
        if (ok) break;
        if (i > 5000) std::abort();
        ::usleep(1000);
      }
    }
    return out;
  }();
  return *s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Server& s = server();
  const std::string& path = data[0] % 2 == 0 ? s.rpc_path : s.http_path;
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) std::abort();
  timeval tv{5, 0};  // a server that neither answers nor closes within 5 s is a finding (libFuzzer's -timeout)
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  size_t sent = 1;
  while (sent < size) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server closed early: fine
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  char buf[4096];
  for (;;) {  // until the server ends the connection
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno != EINTR)) break;
  }
  ::close(fd);
  return 0;
}
