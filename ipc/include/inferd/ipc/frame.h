// inferd/ipc/frame.h — Cap'n Proto messages over a stream socket, one frame each:
//   [u32 little-endian payload length][payload: the message as a flat array of words]
// Used by the supervisor <-> worker control channel (schemas/worker.capnp). Frames are small and rare;
// the hot path is the shared-memory ring (ring.h).
//
// Thread safety: functions of their arguments; one reader and one writer per socket.
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>

#include <cstdint>
#include <vector>

#include "inferd/status.h"

namespace inferd::ipc {

inline constexpr uint32_t kMaxFrameBytes = 1u << 20;

// The bytes of one frame holding `message`.
std::vector<uint8_t> encode_frame(capnp::MessageBuilder& message);

// Blocking write of a whole frame. kDisconnected if the peer is gone.
Status write_frame(int fd, capnp::MessageBuilder& message);

// Blocking read of one frame's payload. kDisconnected on a clean EOF before a frame starts,
// kCorrupt for a bad length or an EOF inside a frame.
Result<kj::Array<capnp::word>> read_frame(int fd);

// Validates a length prefix read by an asynchronous reader.
Status check_frame_length(uint32_t length);

}  // namespace inferd::ipc
