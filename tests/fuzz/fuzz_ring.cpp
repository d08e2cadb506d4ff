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
  // Input: (offset: 3 bytes, value: 8 bytes) writes anywhere in the segment: the header and counters,
  // and the completion entries (their counts, outputs, alternatives and embedding length), then reads.
  auto* base = reinterpret_cast<uint8_t*>(&sup->header());
  // The geometry as created, read once before any input could overwrite the header.
  static const size_t comp_offset = sup->header().comp_offset;
  const size_t span = comp_offset + 2 * sizeof(Completion);  // the whole segment in use
  size_t i = 0;
  for (; i + 11 <= size; i += 11) {
    size_t off = static_cast<size_t>(data[i]) | static_cast<size_t>(data[i + 1]) << 8 | static_cast<size_t>(data[i + 2]) << 16;
    // Half of the writes land in the first completion's fixed part, where the checks are.
    if (off & 1) off = comp_offset + off % offsetof(Completion, embd);
    off %= span - 8;
    std::memcpy(base + off, data + i + 3, 8);
  }
  for (int k = 0; k < 4; ++k) {
    const Completion* c = sup->next_completion();
    if (c == nullptr) break;
    volatile uint32_t n = c->n_outputs;  // read the copy, embeddings included
    (void)n;
    INFERD_ASSERT(c->n_embd_floats <= kMaxEmbdFloats);
    volatile float last = c->n_embd_floats > 0 ? c->embd[c->n_embd_floats - 1] : 0.0f;
    (void)last;
    sup->release_completion();
  }
  (void)sup->submission_slot();
  return 0;
}
