// inferd/gguf.h — read-only access to GGUF model files (versions 2 and 3).
//
// A GgufFile memory-maps the whole file (or owns an in-memory buffer, for tests and fuzzing),
// validates every header field against the real file size while it opens, and afterwards hands
// out metadata values and tensor descriptors that point into the mapping: tensor data and string
// values are never copied. Anything a file can get wrong becomes a Status (Code::kCorrupt, or
// kNotFound for a missing file) naming the file, the key or tensor, and the byte offset.
//
// Invariants established by open()/from_buffer() and relied on by every accessor:
//   1. Every metadata value (including nested arrays and every string in them) lies inside the file;
//      bools are 0 or 1; array nesting is at most kMaxArrayDepth deep.
//   2. Keys are unique and non-empty; tensor names are unique, 1..kMaxTensorName bytes.
//   3. Each tensor has 1..4 dims, ne >= 0, a known type, ne[0] a multiple of the type's block size,
//      nbytes computed without overflow, data offset a multiple of alignment(), and
//      [data, data + nbytes) inside the file; no two tensors' data overlap.
//
// Thread safety: a GgufFile is immutable after it is created; all const methods may be called from
// any number of threads at once. Views, spans and TensorInfo::data stay valid while it lives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "inferd/dtype.h"
#include "inferd/weight_layout.h"
#include "inferd/status.h"

namespace inferd::gguf {

// Metadata value types; the numbers are the file format's.
enum class ValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6,
  kBool = 7, kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// "u32", "string", ...; "?" for a value outside the enum.
const char* value_type_name(ValueType type);

constexpr size_t kDefaultAlignment = 32;
constexpr int kMaxArrayDepth = 4;     // an array of arrays of ... at most this many levels
constexpr size_t kMaxKeyLength = 65535;  // the GGUF specification's limit
constexpr size_t kMaxTensorName = 63;    // ggml's GGML_MAX_NAME - 1

struct TensorInfo {
  std::string name;
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the contiguous dimension (ggml order)
  DType type = DType::kF32;
  uint64_t offset = 0;           // relative to the data section (GgufFile::data_offset())
  size_t nbytes = 0;
  const uint8_t* data = nullptr; // into the mapping; nbytes readable bytes
  // How the data's blocks are arranged: always kRows in a GGUF file; a weights segment may hold some
  // matrices interleaved (inferd/weight_layout.h), and says so through from_memory().
  WeightLayout layout = WeightLayout::kRows;

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

struct ArrayInfo {
  ValueType elem_type;
  uint64_t count;
};

// A read-only, shared mapping of a whole file. Owns the mapping; unmaps on destruction.
class MappedFile {
 public:
  // kNotFound if the file does not exist, kInvalidArgument if it is not a regular file,
  // kCorrupt if it is empty, kFailed for other I/O errors.
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  MappedFile(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  const uint8_t* data_;
  size_t size_;
};

class Parser;

class GgufFile {
 public:
  static Result<std::unique_ptr<GgufFile>> open(const std::string& path);
  // Parses `bytes` as if it were the file `name` (used in error messages).
  static Result<std::unique_ptr<GgufFile>> from_buffer(std::vector<uint8_t> bytes, std::string name);
  // Parses `size` bytes at `data` in place, without copying (a GGUF image inside a shared-memory weights
  // segment). `keepalive` owns the memory; the GgufFile holds it until destroyed. `layouts`, when not
  // empty, gives each tensor's layout in table order (kCorrupt if its size differs from the tensor count
  // or a layout does not fit its tensor's type and shape).
  static Result<std::unique_ptr<GgufFile>> from_memory(const uint8_t* data, size_t size, std::string name,
                                                       std::shared_ptr<const void> keepalive,
                                                       std::span<const WeightLayout> layouts = {});
  // The metadata and tensor table only, read with pread into a buffer (a prefix of the file, grown until
  // the table fits): nothing is mapped, so a file truncated or rewritten meanwhile gives an error, never
  // SIGBUS. Tensor data pointers are null; file_size() is the file's. Opened as open() opens (O_NONBLOCK,
  // a regular file only). For laying out a copy of the file (ipc::WeightsSegment).
  static Result<std::unique_ptr<GgufFile>> read_header(const std::string& path);

  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  size_t file_size() const { return file_size_; }
  const uint8_t* data() const { return base_; }
  // Start of the tensor data section, in bytes from the start of the file.
  size_t data_offset() const { return data_offset_; }

  bool has_key(std::string_view key) const;
  std::vector<std::string> keys() const;  // in file order
  ValueType type_of(std::string_view key) const;  // precondition: has_key(key)

  // Getters: kNotFound if the key is missing, kCorrupt (naming the key) if its type does not fit.
  Result<std::string_view> get_string(std::string_view key) const;
  Result<uint32_t> get_u32(std::string_view key) const;  // any integer type whose value fits
  Result<int64_t> get_i64(std::string_view key) const;   // any integer type whose value fits
  Result<float> get_f32(std::string_view key) const;     // f32, f64 or any integer type
  Result<bool> get_bool(std::string_view key) const;
  Result<ArrayInfo> get_array_info(std::string_view key) const;
  Result<std::vector<std::string_view>> get_string_array(std::string_view key) const;
  Result<std::vector<float>> get_f32_array(std::string_view key) const;  // f32 or f64 elements
  Result<std::vector<int32_t>> get_i32_array(std::string_view key) const;  // any int type that fits
  // The value for display: strings quoted and escaped, arrays abbreviated to about max_len chars.
  // Precondition: has_key(key).
  std::string value_to_string(std::string_view key, size_t max_len = 80) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;  // nullptr if absent

 private:
  // One metadata entry; offsets are absolute file offsets of already-validated bytes.
  struct KvEntry {
    std::string_view key;       // into the file
    ValueType type;
    size_t value_offset;        // first byte of the value (for arrays: of the element type field)
    ValueType elem_type = ValueType::kU8;  // arrays only
    uint64_t count = 0;                    // arrays only
    size_t elems_offset = 0;               // arrays only: first element
  };

  GgufFile(std::string path, std::unique_ptr<MappedFile> mapping, std::vector<uint8_t> buffer);
  Status parse();
  Status parse_body(Parser& in);
  const KvEntry* find(std::string_view key) const;
  Result<const KvEntry*> find_typed(std::string_view key, ValueType type) const;
  Status type_error(const KvEntry& kv, const char* expected) const;
  Result<const KvEntry*> find_array(std::string_view key, const char* expected) const;

  std::string path_;
  std::unique_ptr<MappedFile> mapping_;  // set by open()
  std::vector<uint8_t> buffer_;          // set by from_buffer()
  std::shared_ptr<const void> keepalive_;  // set by from_memory()
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;        // bytes at base_
  size_t file_size_ = 0;   // the file's (size_, but for read_header())
  bool ran_out_ = false;   // parse() failed for want of bytes past size_
  uint32_t version_ = 0;
  size_t alignment_ = kDefaultAlignment;
  size_t data_offset_ = 0;
  std::vector<KvEntry> kvs_;
  std::unordered_map<std::string_view, size_t> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;  // names viewed in the file
};

}  // namespace inferd::gguf
