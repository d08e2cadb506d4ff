#include "inferd/ipc/frame.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace inferd::ipc {

std::vector<uint8_t> encode_frame(capnp::MessageBuilder& message) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  kj::ArrayPtr<const kj::byte> bytes = words.asBytes();
  INFERD_ASSERT(bytes.size() <= kMaxFrameBytes);
  std::vector<uint8_t> out(4 + bytes.size());
  uint32_t n = static_cast<uint32_t>(bytes.size());
  std::memcpy(out.data(), &n, 4);  // little-endian hosts only (x86-64, aarch64)
  std::memcpy(out.data() + 4, bytes.begin(), bytes.size());
  return out;
}

Status write_frame(int fd, capnp::MessageBuilder& message) {
  std::vector<uint8_t> bytes = encode_frame(message);
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE || errno == ECONNRESET) return Status(Code::kDisconnected, "control channel closed");
      return errno_error("control channel write");
    }
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

namespace {

// Reads exactly n bytes; returns the number read before EOF (< n) or -1 on error.
ssize_t read_full(int fd, void* buf, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::read(fd, static_cast<uint8_t*>(buf) + done, n - done);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(done);
}

}  // namespace

Status check_frame_length(uint32_t length) {
  if (length == 0 || length % sizeof(capnp::word) != 0 || length > kMaxFrameBytes) {
    return Status(Code::kCorrupt, "control frame of " + std::to_string(length) + " bytes");
  }
  return Status::ok();
}

Result<kj::Array<capnp::word>> read_frame(int fd) {
  uint32_t length = 0;
  ssize_t r = read_full(fd, &length, 4);
  if (r == 0) return Status(Code::kDisconnected, "control channel closed");
  if (r < 0) return errno_error("control channel read");
  if (r != 4) return Status(Code::kCorrupt, "control channel closed inside a frame header");
  INFERD_RETURN_IF_ERROR(check_frame_length(length));
  auto words = kj::heapArray<capnp::word>(length / sizeof(capnp::word));
  r = read_full(fd, words.begin(), length);
  if (r < 0) return errno_error("control channel read");
  if (static_cast<uint32_t>(r) != length) return Status(Code::kCorrupt, "control channel closed inside a frame");
  return words;
}

}  // namespace inferd::ipc
