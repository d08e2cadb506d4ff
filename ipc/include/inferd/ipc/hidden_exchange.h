// inferd/ipc/hidden_exchange.h — hidden states passed between two pipeline stages (two workers that
// split a model's layers, like llama.cpp's -ngl), in shared memory.
//
// The supervisor creates one exchange per stage boundary and passes it to both workers. For each step
// the earlier stage writes the hidden states of the step's tokens (n_tokens x n_embd floats), then
// publishes the step id with a release store; the supervisor forwards the step to the later stage,
// which checks the id and the token count (acquire load) before reading. Only one step is ever in
// flight, so one buffer suffices.
//
//   0     HiddenHeader (128 B): magic "INFDHID1", version, n_embd, max_tokens, data_offset,
//         segment_bytes; at 64: step_id (atomic), n_tokens
//   4096  float data[max_tokens][n_embd]
//
// Thread safety: one writer process and one reader process, ordered by the supervisor.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "inferd/ipc/unique_fd.h"
#include "inferd/status.h"

namespace inferd::ipc {

inline constexpr char kHiddenMagic[8] = {'I', 'N', 'F', 'D', 'H', 'I', 'D', '1'};
inline constexpr uint32_t kHiddenVersion = 1;

struct HiddenHeader {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  uint32_t n_embd;
  uint32_t max_tokens;
  uint64_t data_offset;
  uint64_t segment_bytes;
  uint8_t pad0[24];
  alignas(64) std::atomic<uint64_t> step_id;  // the step whose hidden states the data hold
  uint32_t n_tokens;
  uint8_t pad1[52];
};
static_assert(sizeof(HiddenHeader) == 128);
static_assert(offsetof(HiddenHeader, data_offset) == 24);
static_assert(offsetof(HiddenHeader, step_id) == 64);
static_assert(offsetof(HiddenHeader, n_tokens) == 72);

class HiddenExchange {
 public:
  static Result<std::unique_ptr<HiddenExchange>> create(uint32_t n_embd, uint32_t max_tokens);
  // Maps a passed-in exchange and checks it against what this worker expects.
  static Result<std::unique_ptr<HiddenExchange>> attach(UniqueFd fd, uint32_t n_embd, uint32_t max_tokens);
  ~HiddenExchange();
  HiddenExchange(const HiddenExchange&) = delete;
  HiddenExchange& operator=(const HiddenExchange&) = delete;

  int fd() const { return fd_.get(); }
  HiddenHeader& header() const { return *reinterpret_cast<HiddenHeader*>(base_); }
  float* data() const { return reinterpret_cast<float*>(base_ + header().data_offset); }

  // Writer: copy `n_tokens` rows, then publish `step_id`.
  void publish(uint64_t step_id, const float* rows, uint32_t n_tokens) const;
  // Reader: the rows of `step_id`, or kFailed if the exchange holds another step or another size.
  Result<const float*> read(uint64_t step_id, uint32_t n_tokens) const;

 private:
  HiddenExchange() = default;
  UniqueFd fd_;
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

}  // namespace inferd::ipc
