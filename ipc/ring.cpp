#include "inferd/ipc/ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <new>

namespace inferd::ipc {
namespace {

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace

template <typename T>
T* RingSegment::entry(uint64_t offset, uint64_t index, uint32_t capacity) const {
  return reinterpret_cast<T*>(base_ + offset + (index % capacity) * sizeof(T));
}

bool RingSegment::plausible(uint64_t lo, uint64_t value, uint64_t hi) {
  if (value < lo || value > hi) broken_ = true;
  return !broken_;
}

RingSegment::~RingSegment() {
  if (base_) ::munmap(base_, size_);
}

Result<std::unique_ptr<RingSegment>> RingSegment::create(uint32_t sub_capacity, uint32_t comp_capacity) {
  INFERD_ASSERT(sub_capacity > 0 && comp_capacity > 0);
  const size_t sub_offset = align_up(sizeof(RingHeader), 4096);
  const size_t comp_offset = align_up(sub_offset + size_t{sub_capacity} * sizeof(Submission), 4096);
  const size_t size = align_up(comp_offset + size_t{comp_capacity} * sizeof(Completion), 4096);
  UniqueFd fd(::memfd_create("inferd-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return errno_error("memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) return errno_error("sizing the ring segment");
  // Neither side may change the size: a shrunk segment would turn the other's accesses into SIGBUS.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return errno_error("sealing the ring segment");
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return errno_error("mmap of the ring segment");
  std::unique_ptr<RingSegment> ring(new RingSegment());
  ring->fd_ = std::move(fd);
  ring->base_ = static_cast<uint8_t*>(p);
  ring->size_ = size;
  // The memfd is zero-filled; construct the header in place.
  auto* h = new (p) RingHeader{};
  std::memcpy(h->magic, kRingMagic, sizeof(kRingMagic));
  h->version = kRingVersion;
  h->header_bytes = sizeof(RingHeader);
  h->sub_capacity = sub_capacity;
  h->comp_capacity = comp_capacity;
  h->max_step_tokens = kMaxStepTokens;
  h->max_step_seqs = kMaxStepSeqs;
  h->submission_bytes = sizeof(Submission);
  h->completion_bytes = sizeof(Completion);
  h->sub_offset = sub_offset;
  h->comp_offset = comp_offset;
  h->segment_bytes = size;
  ring->sub_capacity_ = sub_capacity;
  ring->comp_capacity_ = comp_capacity;
  ring->sub_offset_ = sub_offset;
  ring->comp_offset_ = comp_offset;
  ring->sub_copy_ = std::make_unique<Submission>();
  ring->comp_copy_ = std::make_unique<Completion>();
  return ring;
}

Result<std::unique_ptr<RingSegment>> RingSegment::attach(UniqueFd fd) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errno_error("ring segment: fstat");
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < sizeof(RingHeader)) return Status(Code::kCorrupt, "ring segment smaller than its header");
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return errno_error("ring segment: mmap");
  std::unique_ptr<RingSegment> ring(new RingSegment());
  ring->fd_ = std::move(fd);
  ring->base_ = static_cast<uint8_t*>(p);
  ring->size_ = size;
  const RingHeader& h = ring->header();
  auto corrupt = [](const std::string& what) { return Status(Code::kCorrupt, "ring segment: " + what); };
  if (std::memcmp(h.magic, kRingMagic, sizeof(kRingMagic)) != 0) return corrupt("bad magic");
  if (h.version != kRingVersion) return corrupt("version " + std::to_string(h.version));
  if (h.header_bytes != sizeof(RingHeader) || h.submission_bytes != sizeof(Submission) ||
      h.completion_bytes != sizeof(Completion) || h.max_step_tokens != kMaxStepTokens ||
      h.max_step_seqs != kMaxStepSeqs) {
    return corrupt("entry sizes or limits differ from this build's");
  }
  if (h.segment_bytes != size || h.sub_capacity == 0 || h.comp_capacity == 0 ||
      h.sub_offset + uint64_t{h.sub_capacity} * sizeof(Submission) > size ||
      h.comp_offset + uint64_t{h.comp_capacity} * sizeof(Completion) > size || h.sub_offset < sizeof(RingHeader) ||
      h.comp_offset < h.sub_offset + uint64_t{h.sub_capacity} * sizeof(Submission)) {
    return corrupt("entries outside the segment");
  }
  // Its size is fixed for good (create() sealed it).
  const int seals = ::fcntl(ring->fd_.get(), F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    return corrupt("the segment is not sealed against resizing");
  }
  ring->sub_capacity_ = h.sub_capacity;
  ring->comp_capacity_ = h.comp_capacity;
  ring->sub_offset_ = h.sub_offset;
  ring->comp_offset_ = h.comp_offset;
  // A fresh ring: every counter at zero (the worker attaches before any step).
  ring->sub_head_ = h.sub_head.load(std::memory_order_acquire);
  ring->sub_tail_ = h.sub_tail.load(std::memory_order_acquire);
  ring->comp_head_ = h.comp_head.load(std::memory_order_acquire);
  ring->comp_tail_ = h.comp_tail.load(std::memory_order_acquire);
  if (ring->sub_tail_ > ring->sub_head_ || ring->sub_head_ - ring->sub_tail_ > ring->sub_capacity_ ||
      ring->comp_tail_ > ring->comp_head_ || ring->comp_head_ - ring->comp_tail_ > ring->comp_capacity_) {
    return corrupt("counters out of order");
  }
  ring->sub_copy_ = std::make_unique<Submission>();
  ring->comp_copy_ = std::make_unique<Completion>();
  return ring;
}

// Producer: our head is private; the consumer's tail must lie in [head - capacity, head].
Submission* RingSegment::submission_slot() {
  const uint64_t tail = header().sub_tail.load(std::memory_order_acquire);
  if (!plausible(sub_head_ >= sub_capacity_ ? sub_head_ - sub_capacity_ : 0, tail, sub_head_)) return nullptr;
  if (sub_head_ - tail >= sub_capacity_) return nullptr;
  return entry<Submission>(sub_offset_, sub_head_, sub_capacity_);
}

void RingSegment::publish_submission() {
  header().sub_head.store(++sub_head_, std::memory_order_release);
}

// Consumer: our tail is private; the producer's head must lie in [tail, tail + capacity].
const Submission* RingSegment::next_submission() {
  const uint64_t head = header().sub_head.load(std::memory_order_acquire);
  if (!plausible(sub_tail_, head, sub_tail_ + sub_capacity_) || head == sub_tail_) return nullptr;
  // The fixed part, then only the block ids in use (n_blocks as copied, bounded by the array).
  const Submission* e = entry<Submission>(sub_offset_, sub_tail_, sub_capacity_);
  std::memcpy(static_cast<void*>(sub_copy_.get()), e, offsetof(Submission, blocks));
  const uint32_t n_blocks = std::min(sub_copy_->n_blocks, kMaxStepBlocks);
  sub_copy_->n_blocks = n_blocks;
  std::memcpy(sub_copy_->blocks, e->blocks, sizeof(int32_t) * n_blocks);
  return sub_copy_.get();
}

void RingSegment::release_submission() {
  header().sub_tail.store(++sub_tail_, std::memory_order_release);
}

Completion* RingSegment::completion_slot() {
  const uint64_t tail = header().comp_tail.load(std::memory_order_acquire);
  if (!plausible(comp_head_ >= comp_capacity_ ? comp_head_ - comp_capacity_ : 0, tail, comp_head_)) return nullptr;
  if (comp_head_ - tail >= comp_capacity_) return nullptr;
  return entry<Completion>(comp_offset_, comp_head_, comp_capacity_);
}

void RingSegment::publish_completion() {
  header().comp_head.store(++comp_head_, std::memory_order_release);
}

const Completion* RingSegment::next_completion() {
  const uint64_t head = header().comp_head.load(std::memory_order_acquire);
  if (!plausible(comp_tail_, head, comp_tail_ + comp_capacity_)) return nullptr;
  // The peer's other counter is checked here too, so a lie about it is caught at the next wake-up even
  // when no submission follows.
  const uint64_t sub_tail = header().sub_tail.load(std::memory_order_acquire);
  if (!plausible(sub_head_ >= sub_capacity_ ? sub_head_ - sub_capacity_ : 0, sub_tail, sub_head_)) return nullptr;
  if (head == comp_tail_) return nullptr;
  // Everything up to the embeddings, then only the embedding floats the entry says it holds (bounded
  // by the array, whatever the peer wrote), so a step without embeddings copies ~14 KiB, not 78.
  const auto* src = entry<Completion>(comp_offset_, comp_tail_, comp_capacity_);
  std::memcpy(static_cast<void*>(comp_copy_.get()), src, offsetof(Completion, embd));
  comp_copy_->error[sizeof(comp_copy_->error) - 1] = '\0';  // a string the peer may have left unterminated
  comp_copy_->n_embd_floats = std::min(comp_copy_->n_embd_floats, kMaxEmbdFloats);
  std::memcpy(comp_copy_->embd, src->embd, sizeof(float) * comp_copy_->n_embd_floats);
  return comp_copy_.get();
}

void RingSegment::release_completion() {
  header().comp_tail.store(++comp_tail_, std::memory_order_release);
}

}  // namespace inferd::ipc
