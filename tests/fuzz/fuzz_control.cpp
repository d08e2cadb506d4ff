// libFuzzer target: the control frames a worker sends the supervisor (schemas/worker.capnp over
// ipc/frame.h), as the supervisor decodes them. A worker is not trusted: any bytes must decode to one of
// the four messages or to an error, never crash or read out of bounds, and strings come out bounded.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "inferd/ipc/frame.h"
#include "worker_process.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace inferd;
  // Input: a length prefix as the asynchronous reader sees it, then the payload.
  if (size < 4) return 0;
  uint32_t length = 0;
  std::memcpy(&length, data, 4);
  (void)ipc::check_frame_length(length);
  auto m = daemon::decode_worker_message(std::span<const uint8_t>(data + 4, size - 4));
  if (m) {
    INFERD_ASSERT(m->ready.device.size() <= daemon::kMaxWorkerText && m->failure.size() <= daemon::kMaxWorkerText);
  }
  return 0;
}
