#include "inferd/ipc/hidden_exchange.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <string>

namespace inferd::ipc {
namespace {

constexpr size_t kDataOffset = 4096;

}  // namespace

HiddenExchange::~HiddenExchange() {
  if (base_) ::munmap(base_, size_);
}

Result<std::unique_ptr<HiddenExchange>> HiddenExchange::create(uint32_t n_embd, uint32_t max_tokens) {
  INFERD_ASSERT(n_embd > 0 && max_tokens > 0);
  const size_t size = kDataOffset + size_t{n_embd} * max_tokens * sizeof(float);
  UniqueFd fd(::memfd_create("inferd-hidden", MFD_CLOEXEC));
  if (!fd) return errno_error("memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) return errno_error("sizing the hidden-state exchange");
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return errno_error("mmap of the hidden-state exchange");
  std::unique_ptr<HiddenExchange> x(new HiddenExchange());
  x->fd_ = std::move(fd);
  x->base_ = static_cast<uint8_t*>(p);
  x->size_ = size;
  auto* h = new (p) HiddenHeader{};
  std::memcpy(h->magic, kHiddenMagic, sizeof(kHiddenMagic));
  h->version = kHiddenVersion;
  h->header_bytes = sizeof(HiddenHeader);
  h->n_embd = n_embd;
  h->max_tokens = max_tokens;
  h->data_offset = kDataOffset;
  h->segment_bytes = size;
  return x;
}

Result<std::unique_ptr<HiddenExchange>> HiddenExchange::attach(UniqueFd fd, uint32_t n_embd, uint32_t max_tokens) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errno_error("hidden-state exchange: fstat");
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < kDataOffset) return Status(Code::kCorrupt, "hidden-state exchange smaller than its header");
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return errno_error("hidden-state exchange: mmap");
  std::unique_ptr<HiddenExchange> x(new HiddenExchange());
  x->fd_ = std::move(fd);
  x->base_ = static_cast<uint8_t*>(p);
  x->size_ = size;
  const HiddenHeader& h = x->header();
  if (std::memcmp(h.magic, kHiddenMagic, sizeof(kHiddenMagic)) != 0 || h.version != kHiddenVersion ||
      h.header_bytes != sizeof(HiddenHeader)) {
    return Status(Code::kCorrupt, "hidden-state exchange: bad magic, version or header size");
  }
  if (h.n_embd != n_embd || h.max_tokens < max_tokens || h.data_offset != kDataOffset || h.segment_bytes != size ||
      kDataOffset + uint64_t{h.n_embd} * h.max_tokens * sizeof(float) > size) {
    return Status(Code::kCorrupt, "hidden-state exchange: sized for another model or batch");
  }
  return x;
}

void HiddenExchange::publish(uint64_t step_id, const float* rows, uint32_t n_tokens) const {
  HiddenHeader& h = header();
  INFERD_ASSERT(n_tokens <= h.max_tokens);
  std::memcpy(data(), rows, size_t{n_tokens} * h.n_embd * sizeof(float));
  h.n_tokens = n_tokens;
  h.step_id.store(step_id, std::memory_order_release);
}

Result<const float*> HiddenExchange::read(uint64_t step_id, uint32_t n_tokens) const {
  const HiddenHeader& h = header();
  uint64_t id = h.step_id.load(std::memory_order_acquire);
  if (id != step_id || h.n_tokens != n_tokens) {
    return Status(Code::kFailed, "hidden-state exchange holds step " + std::to_string(id) + " (" +
                                     std::to_string(h.n_tokens) + " tokens), expected step " + std::to_string(step_id) +
                                     " (" + std::to_string(n_tokens) + ")");
  }
  return static_cast<const float*>(data());
}

}  // namespace inferd::ipc
