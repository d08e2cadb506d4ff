#include "inferd/ipc/weights_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <utility>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <vector>

#include "inferd/weight_layout.h"

namespace inferd::ipc {
namespace {

constexpr unsigned kSeals = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
constexpr size_t kCopyChunk = size_t{64} << 20;

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

void copy_cstr(char* dst, size_t cap, std::string_view src) {
  size_t n = std::min(cap - 1, src.size());
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

bool same_identity(const struct stat& a, const struct stat& b) {
  return a.st_size == b.st_size && a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec &&
         a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// MADV_COLLAPSE from <linux/mman.h> (Linux 6.1); older headers lack the name, older kernels answer
// EINVAL, which back_with_huge_pages() ignores.
#ifdef MADV_COLLAPSE
constexpr int kMadvCollapse = MADV_COLLAPSE;
#else
constexpr int kMadvCollapse = 25;
#endif

// MemAvailable from /proc/meminfo in bytes; 0 when it cannot be read (then nothing is refused).
uint64_t mem_available_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "re");
  if (!f) return 0;
  unsigned long long kib = 0;
  char line[256];
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f)) found = std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
  std::fclose(f);
  return found ? kib * 1024 : 0;
}

// Maps `size` bytes of `fd` read-only at a 2 MiB-aligned address, so that 2 MiB pages of the memfd
// (the tensor data starts at a 2 MiB offset) can be mapped whole. The kernel aligns large shmem
// mappings only where shmem THP is enabled; this reserves a larger range and maps into it.
Result<const uint8_t*> map_huge_aligned(int fd, size_t size) {
  const size_t span = size + kHugePageBytes;
  void* r = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) return errno_error("weights segment: reserving address space");
  const auto start = reinterpret_cast<uintptr_t>(r);
  const uintptr_t aligned = (start + kHugePageBytes - 1) & ~uintptr_t{kHugePageBytes - 1};
  void* p = ::mmap(reinterpret_cast<void*>(aligned), size, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    Status err = errno_error("weights segment: mmap");
    ::munmap(r, span);
    return err;
  }
  // Give back the slack on both sides of the mapping.
  if (aligned > start) ::munmap(r, aligned - start);
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t map_end = aligned + (size + page - 1) / page * page;
  if (start + span > map_end) ::munmap(reinterpret_cast<void*>(map_end), start + span - map_end);
  return static_cast<const uint8_t*>(p);
}

// A writable shared mapping of part of the segment while create() writes it, unmapped on destruction and
// never inherited by a child process. The supervisor forks workers on another thread while a load runs; a
// child forked while a writable mapping exists holds it until its exec, and F_SEAL_WRITE fails with EBUSY
// as long as any writable mapping of the memfd exists anywhere (MADV_DONTFORK keeps it out of children;
// seal_segment() covers the instant between mmap and madvise).
class WritableMapping {
 public:
  static Result<WritableMapping> map(int fd, size_t bytes, off_t offset, const char* what) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, offset);
    if (p == MAP_FAILED) return errno_error(std::string("mmap of ") + what);
    WritableMapping m(static_cast<uint8_t*>(p), bytes);
    if (::madvise(p, bytes, MADV_DONTFORK) != 0) return errno_error(std::string("madvise(MADV_DONTFORK) of ") + what);
    return m;
  }
  WritableMapping(WritableMapping&& o) noexcept : base_(std::exchange(o.base_, nullptr)), bytes_(o.bytes_) {}
  WritableMapping& operator=(WritableMapping&&) = delete;
  ~WritableMapping() {
    if (base_ != nullptr) ::munmap(base_, bytes_);
  }
  uint8_t* data() const { return base_; }

 private:
  WritableMapping(uint8_t* base, size_t bytes) : base_(base), bytes_(bytes) {}
  uint8_t* base_;
  size_t bytes_;
};

// Adds kSeals. EBUSY means a writable mapping still exists: only a child forked in the instant between a
// WritableMapping's mmap and its madvise can hold one, and only until it execs, so the seal is retried for
// up to a second before the error is reported.
Status seal_segment(int fd) {
  for (int attempt = 0;; ++attempt) {
    if (::fcntl(fd, F_ADD_SEALS, kSeals) == 0) return Status();
    if (errno != EBUSY || attempt == 1000) return errno_error("sealing the weights segment");
    const timespec one_ms{0, 1000000};
    ::nanosleep(&one_ms, nullptr);
  }
}

// The layout create() gives a tensor: interleaved where the type and shape allow and `interleave` is on.
WeightLayout layout_for(const gguf::TensorInfo& t, bool interleave) {
  if (!interleave || t.n_dims != 2) return WeightLayout::kRows;
  return layout_fits(WeightLayout::kInterleaved16, t.type, t.ne[1], t.ne[0]) ? WeightLayout::kInterleaved16
                                                                            : WeightLayout::kRows;
}

// INFERD_WEIGHTS_LAYOUT: "interleaved" (the default) or "rows".
Result<bool> interleave_from_env() {
  const char* env = std::getenv("INFERD_WEIGHTS_LAYOUT");
  if (env == nullptr || std::strcmp(env, "interleaved") == 0) return true;
  if (std::strcmp(env, "rows") == 0) return false;
  return Status(Code::kInvalidArgument,
                std::string("INFERD_WEIGHTS_LAYOUT is \"") + env + "\"; it must be \"interleaved\" or \"rows\"");
}

// Rewrites the rows x cols matrix of `type` at `matrix` (in the row layout; rows a multiple of 16) interleaved,
// in place, a few MiB at a time through a copy of the plain bytes.
void interleave_in_place(uint8_t* matrix, DType type, int64_t rows, int64_t cols, std::vector<uint8_t>& plain) {
  const size_t group_bytes = kInterleaveRows * dtype_row_bytes(type, cols);
  const int64_t groups = rows / kInterleaveRows;
  const int64_t per_step = std::max<int64_t>(1, static_cast<int64_t>((size_t{4} << 20) / group_bytes));
  for (int64_t g = 0; g < groups; g += per_step) {
    const int64_t n = std::min(per_step, groups - g);
    uint8_t* at = matrix + static_cast<size_t>(g) * group_bytes;
    plain.assign(at, at + static_cast<size_t>(n) * group_bytes);
    interleave_groups(type, cols, n, plain.data(), at);
  }
}

}  // namespace

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  auto p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

struct WeightsSegment::Mapping {
  const uint8_t* base = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (base) ::munmap(const_cast<uint8_t*>(base), size);
  }
};

WeightsSegment::~WeightsSegment() = default;
size_t WeightsSegment::size() const { return mapping_->size; }
const uint8_t* WeightsSegment::data() const { return mapping_->base; }
const TensorEntry* WeightsSegment::tensors() const {
  return reinterpret_cast<const TensorEntry*>(data() + header().table_offset);
}

Result<std::shared_ptr<const WeightsSegment>> WeightsSegment::create(const std::string& path,
                                                                    const ProgressFn& progress) {
  auto interleave = interleave_from_env();
  if (!interleave) return interleave.status();
  // 1. Parse the file once for the layout: its metadata and tensor table only, read with pread (a file
  //    truncated meanwhile is an error, not SIGBUS).
  auto parsed = gguf::GgufFile::read_header(path);
  if (!parsed) return parsed.status();
  const gguf::GgufFile& src = *parsed.value();

  UniqueFd file(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!file) return errno_error(path + ": cannot open");
  struct stat before {};
  if (::fstat(file.get(), &before) != 0) return errno_error(path + ": cannot stat");
  if (!S_ISREG(before.st_mode)) return Status(Code::kInvalidArgument, path + ": not a regular file");
  if (static_cast<uint64_t>(before.st_size) != src.file_size()) {
    return Status(Code::kFailed, path + ": the file changed while loading");
  }

  // 2. Lay the segment out.
  const size_t n_tensors = src.tensors().size();
  const size_t table_offset = kWeightsHeaderBytes;
  const size_t table_bytes = n_tensors * sizeof(TensorEntry);
  const size_t gguf_offset =
      align_up(table_offset + table_bytes + src.data_offset(), kHugePageBytes) - src.data_offset();
  const size_t data_offset = gguf_offset + src.data_offset();  // a multiple of kHugePageBytes
  const size_t gguf_bytes = src.file_size();
  const size_t segment_bytes = align_up(gguf_offset + gguf_bytes, 4096);
  // The copy is resident and cannot be paged back to the file: refuse it up front rather than let
  // the kernel's OOM killer end the daemon half-way through the copy.
  if (const uint64_t available = mem_available_bytes(); available > 0 && segment_bytes > available) {
    return Status(Code::kOutOfRange,
                  path + ": the model needs " + std::to_string(segment_bytes >> 20) + " MiB of shared memory, " +
                      "but only " + std::to_string(available >> 20) + " MiB are available (MemAvailable)");
  }

  std::string memfd_name = "inferd-weights";
  UniqueFd fd(::memfd_create(memfd_name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return errno_error("memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(segment_bytes)) != 0) {
    return errno_error("cannot size the weights segment to " + std::to_string(segment_bytes) + " bytes");
  }

  // 3. Header and table through a temporary writable mapping of the first pages.
  struct Interleaved {
    uint64_t offset;
    DType type;
    int64_t rows, cols;
  };
  std::vector<Interleaved> to_interleave;
  {
    auto head = WritableMapping::map(fd.get(), align_up(table_offset + table_bytes, 4096), 0,
                                     "the weights segment header");
    if (!head) return head.status();
    uint8_t* p = head.value().data();
    auto* h = reinterpret_cast<WeightsHeader*>(p);
    std::memcpy(h->magic, kWeightsMagic, sizeof(kWeightsMagic));
    h->version = kWeightsVersion;
    h->header_bytes = sizeof(WeightsHeader);
    h->segment_bytes = segment_bytes;
    h->table_offset = table_offset;
    h->tensor_count = static_cast<uint32_t>(n_tensors);
    h->tensor_entry_bytes = sizeof(TensorEntry);
    h->gguf_offset = gguf_offset;
    h->gguf_bytes = gguf_bytes;
    h->data_offset = data_offset;
    h->source_bytes = static_cast<uint64_t>(before.st_size);
    h->source_mtime_ns = int64_t{before.st_mtim.tv_sec} * 1000000000 + before.st_mtim.tv_nsec;
    h->source_dev = before.st_dev;
    h->source_ino = before.st_ino;
    copy_cstr(h->source_path, sizeof(h->source_path), path);
    auto name = src.get_string("general.name");
    copy_cstr(h->model_name, sizeof(h->model_name), name ? name.value() : std::string_view());
    auto* table = reinterpret_cast<TensorEntry*>(p + table_offset);
    for (size_t i = 0; i < n_tensors; ++i) {
      const gguf::TensorInfo& t = src.tensors()[i];
      TensorEntry& e = table[i];
      copy_cstr(e.name, sizeof(e.name), t.name);
      e.type = static_cast<uint32_t>(t.type);
      e.n_dims = static_cast<uint32_t>(t.n_dims);
      for (int d = 0; d < 4; ++d) e.ne[d] = t.ne[d];
      e.offset = h->data_offset + t.offset;
      e.bytes = t.nbytes;
      const WeightLayout layout = layout_for(t, interleave.value());
      e.layout = static_cast<uint32_t>(layout);
      if (layout != WeightLayout::kRows) to_interleave.push_back({e.offset, t.type, t.ne[1], t.ne[0]});
    }
    h->table_checksum = fnv1a64(table, table_bytes);
  }
  parsed = Status(Code::kFailed, "released");  // unmap the source's metadata pages

  // 4. The file, byte for byte, copied by the kernel (no user-space buffer, no page faults here).
  uint64_t done = 0;
  while (done < gguf_bytes) {
    off_t in_off = static_cast<off_t>(done);
    if (::lseek(fd.get(), static_cast<off_t>(gguf_offset + done), SEEK_SET) < 0) return errno_error("lseek");
    size_t want = std::min(kCopyChunk, gguf_bytes - done);
    ssize_t n = ::sendfile(fd.get(), file.get(), &in_off, want);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error(path + ": copying into the weights segment");
    }
    if (n == 0) return Status(Code::kFailed, path + ": the file shrank while loading");
    done += static_cast<uint64_t>(n);
    if (progress) progress("copying", done, gguf_bytes);
  }
  struct stat after {};
  if (::fstat(file.get(), &after) != 0) return errno_error(path + ": cannot stat");
  if (!same_identity(before, after)) return Status(Code::kFailed, path + ": the file changed while loading");

  // 5. The matrices the CPU kernels read interleaved, rewritten in place (a permutation of their bytes).
  if (!to_interleave.empty()) {
    // Through a writable mapping of the tensor data (2 MiB-aligned), unmapped again before sealing.
    auto data = WritableMapping::map(fd.get(), segment_bytes - data_offset, static_cast<off_t>(data_offset),
                                     "the weights segment's tensor data");
    if (!data) return data.status();
    uint64_t total = 0, rewritten = 0;
    for (const Interleaved& m : to_interleave) total += static_cast<uint64_t>(m.rows) * dtype_row_bytes(m.type, m.cols);
    std::vector<uint8_t> plain;
    for (const Interleaved& m : to_interleave) {
      interleave_in_place(data.value().data() + (m.offset - data_offset), m.type, m.rows, m.cols, plain);
      rewritten += static_cast<uint64_t>(m.rows) * dtype_row_bytes(m.type, m.cols);
      if (progress) progress("interleaving", rewritten, total);
    }
  }

  // 6. Seal: from here on nobody can write or resize it, and every mapping is read-only.
  INFERD_RETURN_IF_ERROR(seal_segment(fd.get()));
  auto seg = attach(std::move(fd));
  if (!seg) return seg.status().with_context(path + ": the copy in shared memory does not validate");
  return seg;
}

Result<std::shared_ptr<const WeightsSegment>> WeightsSegment::attach(UniqueFd fd) {
  int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0) return errno_error("weights segment: F_GET_SEALS");
  if ((static_cast<unsigned>(seals) & (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW)) !=
      (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW)) {
    return Status(Code::kCorrupt, "weights segment is not sealed against writes and resizing");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errno_error("weights segment: fstat");
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < kWeightsHeaderBytes) {
    return Status(Code::kCorrupt, "weights segment is " + std::to_string(size) + " bytes, smaller than its header");
  }
  auto mapped = map_huge_aligned(fd.get(), size);
  if (!mapped) return mapped.status();
  auto mapping = std::make_shared<Mapping>();
  mapping->base = mapped.value();
  mapping->size = size;

  std::shared_ptr<WeightsSegment> seg(new WeightsSegment());
  seg->fd_ = std::move(fd);
  seg->mapping_ = std::move(mapping);
  INFERD_RETURN_IF_ERROR(seg->validate_and_parse());
  return std::shared_ptr<const WeightsSegment>(std::move(seg));
}

Status WeightsSegment::validate_and_parse() {
  const WeightsHeader& h = header();
  const size_t size = mapping_->size;
  auto corrupt = [](const std::string& what) { return Status(Code::kCorrupt, "weights segment: " + what); };
  if (std::memcmp(h.magic, kWeightsMagic, sizeof(kWeightsMagic)) != 0) return corrupt("bad magic");
  if (h.version != kWeightsVersion) {
    return corrupt("version " + std::to_string(h.version) + ", this build reads version " +
                   std::to_string(kWeightsVersion));
  }
  if (h.header_bytes != sizeof(WeightsHeader) || h.tensor_entry_bytes != sizeof(TensorEntry)) {
    return corrupt("header or table entry size does not match this build");
  }
  if (h.segment_bytes != size) return corrupt("recorded size differs from the memfd's size");
  uint64_t table_bytes = uint64_t{h.tensor_count} * sizeof(TensorEntry);
  if (h.table_offset < sizeof(WeightsHeader) || h.table_offset > size || table_bytes > size - h.table_offset) {
    return corrupt("tensor table outside the segment");
  }
  if (h.gguf_offset < h.table_offset + table_bytes || h.gguf_offset > size || h.gguf_bytes > size - h.gguf_offset) {
    return corrupt("GGUF image outside the segment");
  }
  if (h.data_offset % kHugePageBytes != 0) return corrupt("tensor data not aligned to 2 MiB");
  if (fnv1a64(data() + h.table_offset, table_bytes) != h.table_checksum) return corrupt("tensor table checksum");
  if (::memchr(h.source_path, 0, sizeof(h.source_path)) == nullptr ||
      ::memchr(h.model_name, 0, sizeof(h.model_name)) == nullptr) {
    return corrupt("unterminated string in the header");
  }

  const TensorEntry* table = tensors();
  std::vector<WeightLayout> layouts(h.tensor_count);
  for (uint32_t i = 0; i < h.tensor_count; ++i) {
    if (table[i].layout != static_cast<uint32_t>(WeightLayout::kRows) &&
        table[i].layout != static_cast<uint32_t>(WeightLayout::kInterleaved16)) {
      return corrupt("tensor table entry " + std::to_string(i) + " has unknown layout " + std::to_string(table[i].layout));
    }
    layouts[i] = static_cast<WeightLayout>(table[i].layout);
  }
  auto file = gguf::GgufFile::from_memory(data() + h.gguf_offset, h.gguf_bytes,
                                          std::string(h.source_path) + " (shared memory)", mapping_, layouts);
  if (!file) return file.status();
  gguf_ = std::move(file).value();

  if (gguf_->tensors().size() != h.tensor_count) return corrupt("tensor count differs from the GGUF image");
  if (h.gguf_offset + gguf_->data_offset() != h.data_offset) return corrupt("data offset differs from the GGUF image");
  for (uint32_t i = 0; i < h.tensor_count; ++i) {
    const gguf::TensorInfo& t = gguf_->tensors()[i];
    const TensorEntry& e = table[i];
    if (::memchr(e.name, 0, sizeof(e.name)) == nullptr || t.name != e.name ||
        e.type != static_cast<uint32_t>(t.type) || e.offset != h.data_offset + t.offset || e.bytes != t.nbytes) {
      return corrupt("tensor table entry " + std::to_string(i) + " differs from the GGUF image");
    }
  }
  back_with_huge_pages();
  return Status::ok();
}

void WeightsSegment::back_with_huge_pages() {
  // Decode streams every weight once per token: with 4 KiB pages the page walks cost a third of the
  // bandwidth (measured on a 2-core Xeon, a Q4_0 GEMV over 345 MB: 7.6 GB/s with 4 KiB pages, 12.2
  // with 2 MiB). MADV_HUGEPAGE is enough where shmem THP is "advise" or "always"; MADV_COLLAPSE
  // (Linux 6.1+) builds 2 MiB pages synchronously even where shmem_enabled is "never", the default
  // of many distributions. The first mapping (the supervisor's) collapses the page cache of the
  // memfd; later mappings (the workers') find huge pages there and only install the PMD entries.
  // The collapse copies the data once more inside the kernel: 0.15 s for 600 MB here, up to 1.5 s
  // when the (virtual) machine must first back fresh memory; the load pays it once, every token gains
  // (1.1B Q4_0 decode 29.5 -> 32.2 tok/s). Both calls are best effort: an older kernel or fragmented
  // memory leaves 4 KiB pages, slower but the same bytes, and huge_page_bytes() tells.
  // INFERD_WEIGHTS_HUGE_PAGES=0 keeps 4 KiB pages (no advice at all): for loads that must not wait
  // for the collapse, and to measure what the huge pages bring (BENCHMARKS.md).
  if (const char* env = std::getenv("INFERD_WEIGHTS_HUGE_PAGES"); env && std::strcmp(env, "0") == 0) return;
  const size_t begin = header().data_offset;
  const size_t end = mapping_->size / kHugePageBytes * kHugePageBytes;
  if (begin >= end) return;
  auto* p = const_cast<uint8_t*>(data()) + begin;
  ::madvise(p, end - begin, MADV_HUGEPAGE);
  ::madvise(p, end - begin, kMadvCollapse);
}

uint64_t WeightsSegment::huge_page_bytes() const {
  // The mapping's PMD-mapped shmem, from /proc/self/smaps (the only place the kernel reports it).
  std::FILE* f = std::fopen("/proc/self/smaps", "re");
  if (!f) return 0;
  const auto lo = reinterpret_cast<uintptr_t>(data());
  const auto hi = lo + mapping_->size;
  bool inside = false;
  uint64_t kib_total = 0;
  char* line = nullptr;  // whole lines, however long the mapped file's path
  size_t cap = 0;
  while (::getline(&line, &cap, f) > 0) {
    unsigned long a = 0, b = 0;
    char dash = 0;
    if (std::sscanf(line, "%lx%c%lx ", &a, &dash, &b) == 3 && dash == '-') {
      inside = a >= lo && b <= hi;
      continue;
    }
    unsigned long long kib = 0;
    if (inside && std::sscanf(line, "ShmemPmdMapped: %llu kB", &kib) == 1) kib_total += kib;
  }
  std::free(line);
  std::fclose(f);
  return kib_total * 1024;
}

}  // namespace inferd::ipc
