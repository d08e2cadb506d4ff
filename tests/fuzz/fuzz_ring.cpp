// libFuzzer target: the step ring as the supervisor reads it while a hostile worker writes anything into
// the shared segment — the header, the counters, the completion entries. The supervisor's side must never
// read outside the segment, and every completion it returns is a private copy.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "inferd/ipc/ring.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace inferd::ipc;
  static auto sup = std::move(RingSegment::create(2, 2)).value();
  static auto worker = std::move(RingSegment::attach(UniqueFd(::dup(sup->fd())))).value();
  (void)worker;
  // Input: (offset: 2 bytes, value: 8 bytes) writes into the first pages of the segment, then reads.
  auto* base = reinterpret_cast<uint8_t*>(&sup->header());
  const size_t span = sizeof(RingHeader) + 2 * 4096;  // the header and the start of the entries
  size_t i = 0;
  for (; i + 10 <= size; i += 10) {
    const size_t off = (static_cast<size_t>(data[i]) | static_cast<size_t>(data[i + 1]) << 8) % (span - 8);
    std::memcpy(base + off, data + i + 2, 8);
  }
  for (int k = 0; k < 4; ++k) {
    const Completion* c = sup->next_completion();
    if (c == nullptr) break;
    volatile uint32_t n = c->n_outputs;  // read the copy
    (void)n;
    sup->release_completion();
  }
  (void)sup->submission_slot();
  return 0;
}
