// daemon/rpc_server.h — the Cap'n Proto front end: schemas/inferd.capnp served on a unix socket.
//
// It runs on the main thread's KJ event loop and is a translator only: every request becomes a
// function posted to the Supervisor (which owns all state, on its own thread), and answers come back
// through cross-thread promise fulfillers; generated tokens come back through a GenerationStream and
// go out as flow-controlled TokenSink.send() calls, as many tokens per call as are ready.
//
// Each accepted connection gets its own bootstrap Daemon object that knows the peer's credentials
// (SO_PEERCRED), logged on connect; Admin is refused to peers outside the configured admin uids.
// A connection that sends malformed bytes is dropped by the RPC layer; nothing else is affected.
//
// Thread safety: construct and use on the thread that runs the KJ event loop.
#pragma once

#include <kj/async-io.h>

#include <memory>

#include "supervisor.h"

namespace inferd::daemon {

class RpcServer {
 public:
  RpcServer(Supervisor& supervisor, kj::AsyncIoProvider& io, kj::LowLevelAsyncIoProvider& low, int listen_fd);
  ~RpcServer();
  RpcServer(const RpcServer&) = delete;
  RpcServer& operator=(const RpcServer&) = delete;

  // Accepts connections until the returned promise is dropped.
  kj::Promise<void> run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Creates, binds (mode 0660) and listens on a unix socket at `path`, creating its directory if needed.
// A socket file left by a crashed daemon is removed; a live daemon on the path is an error.
Result<int> listen_unix(const std::string& path);

// Whether `dir` may hold the daemon's socket: a real directory (not a symlink), owned by this process's
// user or by root, and not writable by every user unless sticky (like /tmp). A directory someone else
// made — /tmp/inferd-<uid> created first by another user — is refused: they could replace the socket.
Status check_socket_dir(const std::string& dir);

}  // namespace inferd::daemon
