#include "inferd/ipc/ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <new>

namespace inferd::ipc {
namespace {

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

template <typename T>
T* entry(uint8_t* base, uint64_t offset, uint64_t index, uint32_t capacity) {
  return reinterpret_cast<T*>(base + offset + (index % capacity) * sizeof(T));
}

}  // namespace

RingSegment::~RingSegment() {
  if (base_) ::munmap(base_, size_);
}

Result<std::unique_ptr<RingSegment>> RingSegment::create(uint32_t sub_capacity, uint32_t comp_capacity) {
  INFERD_ASSERT(sub_capacity > 0 && comp_capacity > 0);
  const size_t sub_offset = align_up(sizeof(RingHeader), 4096);
  const size_t comp_offset = align_up(sub_offset + size_t{sub_capacity} * sizeof(Submission), 4096);
  const size_t size = align_up(comp_offset + size_t{comp_capacity} * sizeof(Completion), 4096);
  UniqueFd fd(::memfd_create("inferd-ring", MFD_CLOEXEC));
  if (!fd) return errno_error("memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) return errno_error("sizing the ring segment");
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
  return ring;
}

Submission* RingSegment::submission_slot() const {
  RingHeader& h = header();
  uint64_t head = h.sub_head.load(std::memory_order_relaxed);
  if (head - h.sub_tail.load(std::memory_order_acquire) >= h.sub_capacity) return nullptr;
  return entry<Submission>(base_, h.sub_offset, head, h.sub_capacity);
}

void RingSegment::publish_submission() const {
  RingHeader& h = header();
  h.sub_head.store(h.sub_head.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

const Submission* RingSegment::next_submission() const {
  RingHeader& h = header();
  uint64_t tail = h.sub_tail.load(std::memory_order_relaxed);
  if (tail == h.sub_head.load(std::memory_order_acquire)) return nullptr;
  return entry<Submission>(base_, h.sub_offset, tail, h.sub_capacity);
}

void RingSegment::release_submission() const {
  RingHeader& h = header();
  h.sub_tail.store(h.sub_tail.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

Completion* RingSegment::completion_slot() const {
  RingHeader& h = header();
  uint64_t head = h.comp_head.load(std::memory_order_relaxed);
  if (head - h.comp_tail.load(std::memory_order_acquire) >= h.comp_capacity) return nullptr;
  return entry<Completion>(base_, h.comp_offset, head, h.comp_capacity);
}

void RingSegment::publish_completion() const {
  RingHeader& h = header();
  h.comp_head.store(h.comp_head.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

const Completion* RingSegment::next_completion() const {
  RingHeader& h = header();
  uint64_t tail = h.comp_tail.load(std::memory_order_relaxed);
  if (tail == h.comp_head.load(std::memory_order_acquire)) return nullptr;
  return entry<Completion>(base_, h.comp_offset, tail, h.comp_capacity);
}

void RingSegment::release_completion() const {
  RingHeader& h = header();
  h.comp_tail.store(h.comp_tail.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

}  // namespace inferd::ipc
