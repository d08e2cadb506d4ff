// inferd/ipc/ring.h — the hot path between the supervisor and a worker: two single-producer,
// single-consumer rings in one shared-memory segment.
//
//   submissions  supervisor -> worker   one forward step each: the tokens to process (slot, position,
//                                       id) and, per sequence, its sampling parameters and its KV blocks
//   completions  worker -> supervisor   per step: the token sampled for each sequence that asked (with
//                                       its log-probability and the most likely alternatives when asked),
//                                       or its embedding (the last token's normalized hidden state)
//
// Layout of the segment (a memfd the supervisor creates per worker process and passes at spawn):
//
//   0       RingHeader (320 B): magic "INFDRNG1", version, capacities, limits, offsets,
//           then four 64-byte-aligned counters: sub_head, sub_tail, comp_head, comp_tail
//   sub_offset    Submission[sub_capacity]    (each ends in up to kMaxStepBlocks KV block ids, of which
//                                             only n_blocks are read)
//   comp_offset   Completion[comp_capacity]   (each ends in up to kMaxEmbdFloats embedding floats, of
//                                             which only n_embd_floats are read)
//
// Counters only grow (64-bit: they never wrap); entry i lives at index i % capacity. The producer
// fills entry head % capacity, then publishes it with a release store of head + 1; the consumer reads
// it after an acquire load of head and frees it with a release store of tail + 1. Wake-ups are
// separate (an eventfd per direction), so a ring never blocks: a full ring is a caller's bug (the
// supervisor keeps at most `steps-in-flight` steps queued per worker, at most the capacity).
//
// Steps ahead: a decode step may be queued before the step that samples its input has completed. Its
// token is then kTokenSampled, "the token this slot sampled last", which the worker fills in when it
// runs the step (it runs steps in order). So a worker goes from one decode step to the next without
// waiting for the supervisor; the supervisor drops what a step computed for a sequence that ended
// (end of generation, stop string, cancellation) in the step before.
//
// Trust: each side treats the segment as written by an adversary (a buggy or dying peer may leave
// anything behind). The geometry (capacities, offsets) is validated once and kept in private members,
// never read back from the header; each side keeps its own counters privately and only stores them; a
// counter read from the peer that is not where a correct peer could have put it marks the ring broken()
// (the supervisor then kills the worker); an entry read from the peer is copied out before it is
// returned, so the peer cannot change it between the reader's checks and its use. The memfd is sealed
// against shrinking and growing, so a peer cannot turn the other's accesses into SIGBUS. On top of this,
// the supervisor validates every completion (ids, slots, token ids) and the worker every submission.
//
// Thread safety: one producer thread and one consumer thread per ring (each in its own process).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "inferd/ipc/unique_fd.h"
#include "inferd/status.h"

namespace inferd::ipc {

inline constexpr char kRingMagic[8] = {'I', 'N', 'F', 'D', 'R', 'N', 'G', '1'};
inline constexpr uint32_t kRingVersion = 4;
inline constexpr uint32_t kMaxStepTokens = 512;  // most tokens in one forward step
inline constexpr uint32_t kMaxStepSeqs = 64;     // most sequences in one forward step (= most KV slots)
inline constexpr uint32_t kMaxTopLogprobs = 20;  // most alternatives reported per sampled token (OpenAI's limit)
inline constexpr uint32_t kMaxEmbdFloats = 16384;  // embedding floats one completion carries (all its sequences')
inline constexpr uint32_t kMaxStepBlocks = 16384;  // KV block ids one submission carries (all its sequences')

// One sequence's part in a step.
struct StepSeq {
  uint32_t slot;            // KV slot
  uint32_t flags;           // kSeqWant*
  uint32_t n_sampled;       // tokens this request sampled before this step; a replay resumes the
                            // random sequence there
  uint32_t top_logprobs;    // with kSeqWantLogprobs: how many alternatives, <= kMaxTopLogprobs
  uint64_t seed;            // sampling seed (resolved by the supervisor: never "from the clock" here)
  float temperature, top_p, min_p, repeat_penalty, frequency_penalty, presence_penalty;
  int32_t top_k, repeat_last_n;
  // The sequence's KV blocks: Submission::blocks[first_block, first_block + n_blocks), its positions
  // [0, 64), [64, 128), ... in order, covering every position of its tokens in this step. The worker
  // sets the slot's block table from them each step (a step carries its own table, so a step still in
  // flight for a sequence that has ended writes only into blocks that were that sequence's).
  uint32_t first_block, n_blocks;
};
inline constexpr uint32_t kSeqWantToken = 1u << 0;  // sample a token after this step's last token
// With kSeqWantToken: also report the sampled token's log-probability and the top_logprobs most likely
// tokens' (log-softmax of the model's logits over the vocabulary, before penalties and temperature).
inline constexpr uint32_t kSeqWantLogprobs = 1u << 1;
// With kSeqWantToken: instead of sampling, report the last token's hidden state after the output norm
// (n_embd floats), for embeddings; the sequence samples nothing.
inline constexpr uint32_t kSeqWantEmbedding = 1u << 2;
// The sequence starts afresh in its slot (a new request, or one replayed): its first token's position
// is the length of the prompt prefix whose KV its first blocks already hold (the prefix cache; 0: none).
// A sequence whose first token is at position 0 starts afresh with or without this flag.
inline constexpr uint32_t kSeqFresh = 1u << 3;
static_assert(sizeof(StepSeq) == 64);

// StepToken::token of a sequence's first token in a step: the token its slot sampled in an earlier
// step and has not fed yet (see "Steps ahead" above).
inline constexpr int32_t kTokenSampled = -1;

struct StepToken {
  int32_t token;  // a vocabulary id, or kTokenSampled
  int32_t pos;    // position in the sequence; a sequence's first token in a step at pos 0 starts it afresh
  uint32_t seq;   // index into Submission::seqs
};
static_assert(sizeof(StepToken) == 12);

struct Submission {
  uint64_t id;              // step number, echoed by the completion
  uint32_t n_seqs;
  uint32_t n_tokens;
  StepSeq seqs[kMaxStepSeqs];
  StepToken tokens[kMaxStepTokens];  // a sequence's tokens are consecutive positions, in order
  uint32_t n_blocks;                  // entries of `blocks` in use
  uint32_t reserved0;
  int32_t blocks[kMaxStepBlocks];     // last: a reader copies only the n_blocks in use
};
static_assert(offsetof(Submission, blocks) % 8 == 0);

struct StepOutput {
  uint32_t seq;             // index into the submission's seqs
  int32_t token;            // the sampled token; kTokenEmbedding for an embedding
  float logprob;            // kSeqWantLogprobs: the sampled token's log-probability
  uint32_t n_top;           // kSeqWantLogprobs: alternatives in Completion::top[output index]
};
static_assert(sizeof(StepOutput) == 16);
inline constexpr int32_t kTokenEmbedding = -2;

struct TopLogprob {
  int32_t token;
  float logprob;
};
static_assert(sizeof(TopLogprob) == 8);

struct Completion {
  uint64_t id;              // the submission's id
  int32_t status;           // inferd::Code; non-zero: the step failed and `error` says why
  uint32_t n_outputs;
  uint64_t compute_ns;      // time spent in the forward pass and sampling
  StepOutput outputs[kMaxStepSeqs];
  TopLogprob top[kMaxStepSeqs][kMaxTopLogprobs];  // per output: its n_top alternatives, most likely first
  char error[256];          // NUL-terminated
  uint32_t n_embd_floats;   // the embeddings of the outputs that are kTokenEmbedding, n_embd floats each,
  uint32_t reserved0;       // in output order
  float embd[kMaxEmbdFloats];  // last: a reader copies only the n_embd_floats it needs
};
static_assert(offsetof(Completion, embd) % 8 == 0);

struct RingHeader {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  uint32_t sub_capacity;
  uint32_t comp_capacity;
  uint32_t max_step_tokens;
  uint32_t max_step_seqs;
  uint32_t submission_bytes;
  uint32_t completion_bytes;
  uint64_t sub_offset;
  uint64_t comp_offset;
  uint64_t segment_bytes;
  alignas(64) std::atomic<uint64_t> sub_head;   // written by the supervisor
  alignas(64) std::atomic<uint64_t> sub_tail;   // written by the worker
  alignas(64) std::atomic<uint64_t> comp_head;  // written by the worker
  alignas(64) std::atomic<uint64_t> comp_tail;  // written by the supervisor
  uint8_t pad1[56];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "ring counters must be lock-free across processes");
static_assert(offsetof(RingHeader, sub_offset) == 40);
static_assert(offsetof(RingHeader, sub_head) == 64);
static_assert(offsetof(RingHeader, sub_tail) == 128);
static_assert(offsetof(RingHeader, comp_head) == 192);
static_assert(offsetof(RingHeader, comp_tail) == 256);
static_assert(sizeof(RingHeader) == 320);

// A mapped ring segment. create() makes a fresh memfd (supervisor); attach() maps one passed in
// (worker) and validates its header. Both sides then use the typed views below.
class RingSegment {
 public:
  static Result<std::unique_ptr<RingSegment>> create(uint32_t sub_capacity = 4, uint32_t comp_capacity = 4);
  static Result<std::unique_ptr<RingSegment>> attach(UniqueFd fd);
  ~RingSegment();
  RingSegment(const RingSegment&) = delete;
  RingSegment& operator=(const RingSegment&) = delete;

  int fd() const { return fd_.get(); }
  RingHeader& header() const { return *reinterpret_cast<RingHeader*>(base_); }

  // Producer side of submissions (supervisor).
  Submission* submission_slot();       // the entry to fill, or nullptr if the ring is full (or broken)
  void publish_submission();
  // Consumer side of submissions (worker): a private copy of the next entry, valid until release.
  const Submission* next_submission();  // nullptr if empty (or broken)
  void release_submission();
  // Producer side of completions (worker).
  Completion* completion_slot();
  void publish_completion();
  // Consumer side of completions (supervisor): a private copy of the next entry, valid until release.
  const Completion* next_completion();
  void release_completion();

  // The peer wrote a counter no correct peer could have: the ring can no longer be trusted.
  bool broken() const { return broken_; }

 private:
  RingSegment() = default;
  template <typename T>
  T* entry(uint64_t offset, uint64_t index, uint32_t capacity) const;
  // `peer`'s value is possible given our own counter `ours` (the peer trails or leads by at most
  // `capacity`); otherwise the ring is broken.
  bool plausible(uint64_t lo, uint64_t value, uint64_t hi);

  UniqueFd fd_;
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
  // The geometry, validated once (never read back from the shared header).
  uint32_t sub_capacity_ = 0, comp_capacity_ = 0;
  uint64_t sub_offset_ = 0, comp_offset_ = 0;
  // This side's own counters (the shared ones are only stored to).
  uint64_t sub_head_ = 0, sub_tail_ = 0, comp_head_ = 0, comp_tail_ = 0;
  bool broken_ = false;
  std::unique_ptr<Submission> sub_copy_;
  std::unique_ptr<Completion> comp_copy_;
};

}  // namespace inferd::ipc
