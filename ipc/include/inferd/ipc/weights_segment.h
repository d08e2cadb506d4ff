// inferd/ipc/weights_segment.h — a model's weights in shared memory, laid out like a file format.
//
// The supervisor creates one segment per loaded model: an anonymous memfd (no name in /dev/shm, so
// nothing can be left behind by a crash), filled once from the GGUF file and then sealed
// (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL): from then on the kernel refuses any write
// or resize, and every process — the supervisor and each worker — maps it read-only. A restarted
// worker receives the same fd and maps the same pages: the model file is never read again.
//
//   offset 0           WeightsHeader (4 KiB): magic "INFDWGT1", version, offsets and sizes below,
//                      the source file's identity (path, size, mtime, device, inode)
//   table_offset       TensorEntry[tensor_count] (128 B each): name, type, shape, offset, bytes, layout
//   gguf_offset        the GGUF file (metadata, tokenizer, tensor infos, data), byte for byte except that
//                      the matrices whose entry says kInterleaved16 hold their blocks interleaved
//                      (inferd/weight_layout.h: the same bytes permuted within each 16-row group), the
//                      layout the CPU's decode GEMV reads fastest
//   data_offset        = gguf_offset + the GGUF's data-section offset: a multiple of 2 MiB, so the
//                      tensor data can sit on transparent huge pages; each tensor keeps the GGUF
//                      alignment (32 B or general.alignment), which the SIMD kernels rely on
//
// Which matrices are interleaved: every 2-D Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K tensor whose row count
// is a multiple of 16, unless INFERD_WEIGHTS_LAYOUT=rows (then none: the segment is the file, byte for byte).
//
// Every offset is from the segment's first byte; nothing in the segment is a pointer. A reader
// validates the header, the table checksum and the GGUF (the same validating parser that opens
// files) and cross-checks the table against the GGUF's tensor infos before using anything.
//
// Thread safety: a WeightsSegment is immutable after create()/attach(); share it freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "inferd/gguf.h"
#include "inferd/ipc/unique_fd.h"
#include "inferd/status.h"

namespace inferd::ipc {

inline constexpr char kWeightsMagic[8] = {'I', 'N', 'F', 'D', 'W', 'G', 'T', '1'};
inline constexpr uint32_t kWeightsVersion = 5;  // 2: TensorEntry::layout; 3: Q4_0Column; 4: its 16-row pieces;
                                                // 5: Q4KColumn's pieces and scale bytes
inline constexpr size_t kWeightsHeaderBytes = 4096;
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

struct WeightsHeader {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;        // sizeof(WeightsHeader)
  uint64_t segment_bytes;       // the memfd's size
  uint64_t table_offset;        // TensorEntry[tensor_count]
  uint32_t tensor_count;
  uint32_t tensor_entry_bytes;  // sizeof(TensorEntry)
  uint64_t table_checksum;      // FNV-1a 64 over the table's bytes
  uint64_t gguf_offset;
  uint64_t gguf_bytes;
  uint64_t data_offset;         // multiple of kHugePageBytes
  uint64_t source_bytes;        // the source file's identity when it was copied
  int64_t source_mtime_ns;
  uint64_t source_dev;
  uint64_t source_ino;
  char source_path[1024];       // NUL-terminated, truncated if longer
  char model_name[256];         // general.name, NUL-terminated
  uint8_t reserved[kWeightsHeaderBytes - 1384];
};
static_assert(sizeof(WeightsHeader) == kWeightsHeaderBytes);
static_assert(offsetof(WeightsHeader, version) == 8);
static_assert(offsetof(WeightsHeader, segment_bytes) == 16);
static_assert(offsetof(WeightsHeader, table_checksum) == 40);
static_assert(offsetof(WeightsHeader, data_offset) == 64);
static_assert(offsetof(WeightsHeader, source_path) == 104);
static_assert(offsetof(WeightsHeader, reserved) == 1384);

struct TensorEntry {
  char name[64];     // NUL-terminated (GGUF names are at most 63 bytes)
  uint32_t type;     // DType (ggml's numbering)
  uint32_t n_dims;
  int64_t ne[4];
  uint64_t offset;   // from the segment's first byte
  uint64_t bytes;
  uint32_t layout;   // WeightLayout: how the tensor's blocks are arranged in the segment
  uint8_t reserved[4];
};
static_assert(sizeof(TensorEntry) == 128);
static_assert(offsetof(TensorEntry, type) == 64);
static_assert(offsetof(TensorEntry, offset) == 104);
static_assert(offsetof(TensorEntry, layout) == 120);

// Reports progress of create(): `stage` "copying" (the file into the segment: bytes done of the file's) then,
// where matrices are interleaved, "interleaving" (bytes of interleaved matrices rewritten of their total).
// Called from the creating thread.
using ProgressFn = std::function<void(std::string_view stage, uint64_t done, uint64_t total)>;

class WeightsSegment {
 public:
  // Copies the GGUF file at `path` into a new sealed memfd and attaches to it. The file is parsed
  // once to lay the segment out and the copy is parsed again (that is the GgufFile everyone uses), so
  // a file changed on disk during the copy is detected (kFailed "changed while loading").
  // Errors: those of GgufFile::open (kNotFound, kCorrupt, ...), kOutOfRange when the copy is larger
  // than the memory available (MemAvailable), kInvalidArgument for an INFERD_WEIGHTS_LAYOUT other than
  // "rows" or "interleaved", kFailed for memfd/mmap/IO failures.
  static Result<std::shared_ptr<const WeightsSegment>> create(const std::string& path, const ProgressFn& progress);

  // Maps an existing segment read-only and validates it (kCorrupt naming what is wrong). Takes the fd.
  // Refuses a segment that is not sealed against writes: a worker must never see weights change.
  static Result<std::shared_ptr<const WeightsSegment>> attach(UniqueFd fd);

  ~WeightsSegment();
  WeightsSegment(const WeightsSegment&) = delete;
  WeightsSegment& operator=(const WeightsSegment&) = delete;

  int fd() const { return fd_.get(); }  // to pass to a worker; stays owned here
  const WeightsHeader& header() const { return *reinterpret_cast<const WeightsHeader*>(data()); }
  const TensorEntry* tensors() const;
  size_t size() const;
  const uint8_t* data() const;
  // The GGUF image inside the segment, parsed and validated; it keeps this segment mapped.
  std::shared_ptr<const gguf::GgufFile> gguf() const { return gguf_; }
  // Bytes of this process's mapping backed by 2 MiB pages (0 where the kernel gave none). Reads
  // /proc/self/smaps: for status reports and tests, not for hot paths.
  uint64_t huge_page_bytes() const;

 private:
  struct Mapping;  // the read-only mmap; shared with gguf_ (which must not own the segment: no cycle)
  WeightsSegment() = default;
  Status validate_and_parse();
  void back_with_huge_pages();

  UniqueFd fd_;
  std::shared_ptr<const Mapping> mapping_;
  std::shared_ptr<const gguf::GgufFile> gguf_;
};

// FNV-1a, 64 bits.
uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull);

}  // namespace inferd::ipc
