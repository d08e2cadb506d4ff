#include "inferd/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <limits>

namespace inferd::gguf {

static_assert(std::endian::native == std::endian::little, "GGUF values are read as little-endian");
static_assert(sizeof(size_t) == 8, "offsets are 64-bit");

namespace {

constexpr uint8_t kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint32_t kMaxValueType = static_cast<uint32_t>(ValueType::kF64);

// Lower bounds on the bytes each record occupies; a count claimed by a header is checked against
// these times the bytes left before anything is reserved for it.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;                // key length, 1-byte key, type, u8
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;  // name, n_dims, ne[0], type, offset

// Size of a fixed-size scalar; 0 for string and array.
size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::kU8: case ValueType::kI8: case ValueType::kBool: return 1;
    case ValueType::kU16: case ValueType::kI16: return 2;
    case ValueType::kU32: case ValueType::kI32: case ValueType::kF32: return 4;
    case ValueType::kU64: case ValueType::kI64: case ValueType::kF64: return 8;
    case ValueType::kString: case ValueType::kArray: return 0;
  }
  return 0;
}

// Fewest bytes one value of this type can occupy in a file.
uint64_t min_value_bytes(ValueType t) {
  if (t == ValueType::kString) return 8;
  if (t == ValueType::kArray) return 4 + 8;
  return scalar_size(t);
}

bool is_integer(ValueType t) {
  switch (t) {
    case ValueType::kU8: case ValueType::kI8: case ValueType::kU16: case ValueType::kI16:
    case ValueType::kU32: case ValueType::kI32: case ValueType::kU64: case ValueType::kI64:
      return true;
    default:
      return false;
  }
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// A key or tensor name from the file, made safe to print: non-printable bytes escaped, long
// names cut.
std::string printable(std::string_view s, size_t max_len = 96) {
  std::string out;
  for (unsigned char c : s.substr(0, max_len)) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > max_len) out += "...";
  return out;
}

// Reads a validated integer value as a wide signed/unsigned pair. `neg` is set for negative values.
struct IntValue {
  bool negative;
  uint64_t magnitude_or_value;  // the value when !negative; -value when negative
};

IntValue read_int(const uint8_t* p, ValueType t) {
  auto s = [](int64_t v) {
    return v < 0 ? IntValue{true, static_cast<uint64_t>(-(v + 1)) + 1} : IntValue{false, static_cast<uint64_t>(v)};
  };
  switch (t) {
    case ValueType::kU8: return {false, load<uint8_t>(p)};
    case ValueType::kI8: return s(load<int8_t>(p));
    case ValueType::kU16: return {false, load<uint16_t>(p)};
    case ValueType::kI16: return s(load<int16_t>(p));
    case ValueType::kU32: return {false, load<uint32_t>(p)};
    case ValueType::kI32: return s(load<int32_t>(p));
    case ValueType::kU64: return {false, load<uint64_t>(p)};
    case ValueType::kI64: return s(load<int64_t>(p));
    default: break;
  }
  INFERD_ASSERT(false, "not an integer type");
  return {};
}

// Walks values that parse() has already validated; asserts instead of checking bounds.
class ValidatedReader {
 public:
  ValidatedReader(const uint8_t* base, size_t size) : base_(base), size_(size) {}

  std::string_view string_at(size_t* pos) const {
    INFERD_ASSERT(*pos + 8 <= size_);
    uint64_t len = load<uint64_t>(base_ + *pos);
    INFERD_ASSERT(len <= size_ - *pos - 8);
    std::string_view s(reinterpret_cast<const char*>(base_ + *pos + 8), len);
    *pos += 8 + len;
    return s;
  }

  // Advances *pos past one value of type t.
  void skip(ValueType t, size_t* pos) const {
    if (t == ValueType::kString) {
      string_at(pos);
    } else if (t == ValueType::kArray) {
      auto elem = static_cast<ValueType>(load<uint32_t>(base_ + *pos));
      uint64_t count = load<uint64_t>(base_ + *pos + 4);
      *pos += 12;
      if (size_t sz = scalar_size(elem)) {
        *pos += count * sz;
      } else {
        for (uint64_t i = 0; i < count; ++i) skip(elem, pos);
      }
    } else {
      *pos += scalar_size(t);
    }
    INFERD_ASSERT(*pos <= size_);
  }

  // Appends a display form of the value at *pos, advancing past it. Stops adding text (but still
  // advances) once `out` is longer than `max_len`.
  void append(std::string& out, ValueType t, size_t* pos, size_t max_len) const {
    const uint8_t* p = base_ + *pos;
    char buf[64];
    switch (t) {
      case ValueType::kString: {
        std::string_view s = string_at(pos);
        out.push_back('"');
        for (unsigned char c : s) {
          if (out.size() > max_len) break;
          if (c == '"' || c == '\\') {
            out.push_back('\\');
            out.push_back(static_cast<char>(c));
          } else if (c == '\n') {
            out += "\\n";
          } else if (c < 0x20 || c == 0x7f) {
            std::snprintf(buf, sizeof(buf), "\\x%02x", c);
            out += buf;
          } else {
            out.push_back(static_cast<char>(c));
          }
        }
        out += out.size() > max_len ? "...\"" : "\"";
        return;
      }
      case ValueType::kArray: {
        auto elem = static_cast<ValueType>(load<uint32_t>(p));
        uint64_t count = load<uint64_t>(p + 4);
        *pos += 12;
        out.push_back('[');
        uint64_t shown = 0;
        for (uint64_t i = 0; i < count; ++i) {
          if (out.size() > max_len) {
            // Remaining elements only need skipping; fixed-size ones in one step.
            if (size_t sz = scalar_size(elem)) {
              *pos += (count - i) * sz;
              break;
            }
            skip(elem, pos);
            continue;
          }
          if (i) out += ", ";
          append(out, elem, pos, max_len);
          ++shown;
        }
        if (shown < count) {
          std::snprintf(buf, sizeof(buf), ", ... (%" PRIu64 " items)", count);
          out += buf;
        }
        out.push_back(']');
        return;
      }
      case ValueType::kBool:
        out += p[0] ? "true" : "false";
        break;
      case ValueType::kF32:
        std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(load<float>(p)));
        out += buf;
        break;
      case ValueType::kF64:
        std::snprintf(buf, sizeof(buf), "%.17g", load<double>(p));
        out += buf;
        break;
      default: {
        IntValue v = read_int(p, t);
        std::snprintf(buf, sizeof(buf), v.negative ? "-%" PRIu64 : "%" PRIu64, v.magnitude_or_value);
        out += buf;
        break;
      }
    }
    *pos += scalar_size(t);
  }

 private:
  const uint8_t* base_;
  size_t size_;
};

// Bounds-checked reading of an untrusted file. Every failure names the file, what was being read
// and the byte offset where it starts.
}  // namespace

// The bounds-checked reader of parse() (declared in gguf.h for GgufFile::parse_body).
class Parser {
 public:
  // `size` bytes at `base` are readable; the file has `file_size` (more, when only a prefix was read).
  Parser(const std::string& name, const uint8_t* base, size_t size, size_t file_size)
      : name_(name), base_(base), size_(size), file_size_(file_size) {}

  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }
  size_t file_left() const { return file_size_ - pos_; }
  // A check against left() failed: when `fits_in_file`, only the prefix was too short.
  void short_of(bool fits_in_file) const { ran_out_ = ran_out_ || fits_in_file; }

  Status error(size_t at, const std::string& what) const {
    return Status(Code::kCorrupt, name_ + ": " + what + " (at byte offset " + std::to_string(at) + ")");
  }

  // Whether an error came from the bytes running out (a prefix may just be too short).
  bool ran_out() const { return ran_out_; }

  Status need(size_t n, const std::string& what) const {
    if (left() < n) {
      short_of(n <= file_left());
      return error(pos_, "truncated file: " + what + " needs " + std::to_string(n) + " bytes, only " +
                             std::to_string(left()) + " left");
    }
    return Status::ok();
  }

  template <typename T>
  Status read(const std::string& what, T* out) {
    INFERD_RETURN_IF_ERROR(need(sizeof(T), what));
    *out = load<T>(base_ + pos_);
    pos_ += sizeof(T);
    return Status::ok();
  }

  Status read_string(const std::string& what, std::string_view* out) {
    size_t at = pos_;
    uint64_t len = 0;
    INFERD_RETURN_IF_ERROR(read(what + " length", &len));
    if (len > left()) {
      short_of(len <= file_left());
      return error(at, what + ": string length " + std::to_string(len) + " exceeds the " +
                           std::to_string(left()) + " bytes left in the file");
    }
    *out = std::string_view(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return Status::ok();
  }

  Status read_value_type(const std::string& what, ValueType* out) {
    size_t at = pos_;
    uint32_t raw = 0;
    INFERD_RETURN_IF_ERROR(read(what, &raw));
    if (raw > kMaxValueType) return error(at, what + ": unknown value type " + std::to_string(raw));
    *out = static_cast<ValueType>(raw);
    return Status::ok();
  }

  // Checks one value of type t (already read) and advances past it.
  Status check_value(ValueType t, const std::string& what, int depth) {
    size_t at = pos_;
    if (t == ValueType::kString) {
      std::string_view s;
      return read_string(what, &s);
    }
    if (t == ValueType::kArray) {
      if (depth >= kMaxArrayDepth) {
        return error(at, what + ": arrays nested more than " + std::to_string(kMaxArrayDepth) + " deep");
      }
      ValueType elem;
      uint64_t count = 0;
      INFERD_RETURN_IF_ERROR(read_value_type(what + ": array element type", &elem));
      INFERD_RETURN_IF_ERROR(read(what + ": array length", &count));
      uint64_t min_bytes = min_value_bytes(elem);
      if (count > left() / min_bytes) {
        short_of(count <= file_left() / min_bytes);
        return error(at, what + ": array of " + std::to_string(count) + " " + value_type_name(elem) +
                             " values does not fit in the " + std::to_string(left()) + " bytes left");
      }
      if (elem == ValueType::kBool) {
        for (uint64_t i = 0; i < count; ++i) {
          if (base_[pos_ + i] > 1) {
            return error(pos_ + i, what + ": bool array element " + std::to_string(i) + " is " +
                                       std::to_string(base_[pos_ + i]) + ", not 0 or 1");
          }
        }
      }
      if (size_t sz = scalar_size(elem)) {
        pos_ += count * sz;  // fits: checked against left() above
        return Status::ok();
      }
      for (uint64_t i = 0; i < count; ++i) {
        // Strings are checked inline: a vocabulary has ~10^5 of them, and the element's name is
        // only needed for an error.
        if (elem == ValueType::kString && left() >= 8 && load<uint64_t>(base_ + pos_) <= left() - 8) {
          pos_ += 8 + load<uint64_t>(base_ + pos_);
          continue;
        }
        INFERD_RETURN_IF_ERROR(check_value(elem, what + "[" + std::to_string(i) + "]", depth + 1));
      }
      return Status::ok();
    }
    size_t sz = scalar_size(t);
    INFERD_RETURN_IF_ERROR(need(sz, what + " (" + value_type_name(t) + ")"));
    if (t == ValueType::kBool && base_[pos_] > 1) {
      return error(at, what + ": bool value is " + std::to_string(base_[pos_]) + ", not 0 or 1");
    }
    pos_ += sz;
    return Status::ok();
  }

 private:
  const std::string& name_;
  const uint8_t* base_;
  size_t size_;
  size_t file_size_;
  size_t pos_ = 0;
  mutable bool ran_out_ = false;
};

const char* value_type_name(ValueType type) {
  switch (type) {
    case ValueType::kU8: return "u8";
    case ValueType::kI8: return "i8";
    case ValueType::kU16: return "u16";
    case ValueType::kI16: return "i16";
    case ValueType::kU32: return "u32";
    case ValueType::kI32: return "i32";
    case ValueType::kF32: return "f32";
    case ValueType::kBool: return "bool";
    case ValueType::kString: return "string";
    case ValueType::kArray: return "array";
    case ValueType::kU64: return "u64";
    case ValueType::kI64: return "i64";
    case ValueType::kF64: return "f64";
  }
  return "?";
}

// ---- MappedFile --------------------------------------------------------------------------------

namespace {

// An open, non-empty regular file, closed with the object.
struct RegularFile {
  int fd = -1;
  size_t size = 0;
  RegularFile() = default;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  RegularFile(RegularFile&& o) noexcept : fd(std::exchange(o.fd, -1)), size(o.size) {}
  ~RegularFile() {
    if (fd >= 0) ::close(fd);
  }
};

// O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer; it is refused as not a regular
// file before anything is read. (On a regular file the flag changes nothing.) Symlinks are followed: the
// file they name must be a regular file.
Result<RegularFile> open_regular(const std::string& path) {
  RegularFile f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (f.fd < 0) {
    int err = errno;
    return Status(err == ENOENT ? Code::kNotFound : Code::kFailed, path + ": cannot open: " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return Status(Code::kFailed, path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return Status(Code::kInvalidArgument, path + ": not a regular file");
  if (st.st_size == 0) return Status(Code::kCorrupt, path + ": file is empty (0 bytes)");
  f.size = static_cast<size_t>(st.st_size);
  return f;
}

}  // namespace

Result<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  auto f = open_regular(path);
  if (!f) return f.status();
  const size_t size = f->size;
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, f->fd, 0);
  // The mapping keeps its own reference to the file, which closes with `f`.
  if (p == MAP_FAILED) return Status(Code::kFailed, path + ": mmap failed: " + std::strerror(errno));
  return std::unique_ptr<MappedFile>(new MappedFile(static_cast<const uint8_t*>(p), size));
}

MappedFile::~MappedFile() { ::munmap(const_cast<uint8_t*>(data_), size_); }

// ---- GgufFile: opening and validation ----------------------------------------------------------

GgufFile::GgufFile(std::string path, std::unique_ptr<MappedFile> mapping, std::vector<uint8_t> buffer)
    : path_(std::move(path)), mapping_(std::move(mapping)), buffer_(std::move(buffer)) {
  if (mapping_) {
    base_ = mapping_->data();
    size_ = mapping_->size();
  } else {
    base_ = buffer_.data();
    size_ = buffer_.size();
  }
  file_size_ = size_;
}

GgufFile::~GgufFile() = default;

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  auto mapping = MappedFile::open(path);
  if (!mapping) return mapping.status();
  std::unique_ptr<GgufFile> file(new GgufFile(path, std::move(mapping).value(), {}));
  INFERD_RETURN_IF_ERROR(file->parse());
  return file;
}

Result<std::unique_ptr<GgufFile>> GgufFile::from_buffer(std::vector<uint8_t> bytes, std::string name) {
  std::unique_ptr<GgufFile> file(new GgufFile(std::move(name), nullptr, std::move(bytes)));
  INFERD_RETURN_IF_ERROR(file->parse());
  return file;
}

Result<std::unique_ptr<GgufFile>> GgufFile::from_memory(const uint8_t* data, size_t size, std::string name,
                                                        std::shared_ptr<const void> keepalive,
                                                        std::span<const WeightLayout> layouts) {
  std::unique_ptr<GgufFile> file(new GgufFile(std::move(name), nullptr, {}));
  file->keepalive_ = std::move(keepalive);
  file->base_ = data;
  file->size_ = file->file_size_ = size;
  INFERD_RETURN_IF_ERROR(file->parse());
  if (!layouts.empty()) {
    if (layouts.size() != file->tensors_.size()) {
      return Status(Code::kCorrupt, file->path_ + ": " + std::to_string(layouts.size()) + " tensor layouts for " +
                                        std::to_string(file->tensors_.size()) + " tensors");
    }
    for (size_t i = 0; i < layouts.size(); ++i) {
      TensorInfo& t = file->tensors_[i];
      const int64_t rows = t.n_dims >= 2 ? t.ne[1] * t.ne[2] * t.ne[3] : 1;
      if (!layout_fits(layouts[i], t.type, rows, t.ne[0])) {
        return Status(Code::kCorrupt, file->path_ + ": tensor " + t.name + " (" + dtype_name(t.type) + ") cannot be stored as " +
                                          weight_layout_name(layouts[i]));
      }
      t.layout = layouts[i];
    }
  }
  return file;
}

Result<std::unique_ptr<GgufFile>> GgufFile::read_header(const std::string& path) {
  auto f = open_regular(path);  // as MappedFile::open opens
  if (!f) return f.status();
  const int fd = f->fd;
  const size_t file_size = f->size;
  // Real files' metadata (the vocabulary included) fits in a few MiB: start with 1 MiB, grow 4x, up to
  // 256 MiB (a file whose metadata needs more is refused, not read whole into memory).
  constexpr size_t kMaxHeader = size_t{256} << 20;
  size_t want = std::min<size_t>(file_size, size_t{1} << 20);
  for (;;) {
    std::vector<uint8_t> bytes(want);
    size_t got = 0;
    while (got < want) {
      const ssize_t n = ::pread(fd, bytes.data() + got, want - got, static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Status(Code::kFailed, path + ": read failed: " + std::strerror(errno));
      if (n == 0) return Status(Code::kFailed, path + ": the file shrank while it was read");
      got += static_cast<size_t>(n);
    }
    std::unique_ptr<GgufFile> file(new GgufFile(path, nullptr, std::move(bytes)));
    file->file_size_ = file_size;
    Status parsed = file->parse();
    if (parsed) {
      for (TensorInfo& t : file->tensors_) t.data = nullptr;  // whatever data the prefix holds is not for use
      return file;
    }
    if (!file->ran_out_ || want == file_size) return parsed;
    if (want >= kMaxHeader) {
      return Status(Code::kCorrupt, path + ": the metadata and tensor table take more than " +
                                        std::to_string(kMaxHeader >> 20) + " MiB");
    }
    want = std::min({file_size, kMaxHeader, want * 4});
  }
}

Status GgufFile::parse() {
  Parser in(path_, base_, size_, file_size_);
  Status st = parse_body(in);
  ran_out_ = !st && in.ran_out();
  return st;
}

Status GgufFile::parse_body(Parser& in) {
  if (size_ == 0) return in.error(0, "file is empty (0 bytes)");

  // Header: magic, version, tensor count, kv count.
  INFERD_RETURN_IF_ERROR(in.need(4, "magic"));
  if (std::memcmp(base_, kMagic, 4) != 0) {
    // The bytes found are not quoted: a client may name any file the daemon can read, and the error
    // must not tell it what that file starts with.
    return in.error(0, "bad magic (the file does not start with \"GGUF\"): not a GGUF file");
  }
  uint32_t magic = 0;
  INFERD_RETURN_IF_ERROR(in.read("magic", &magic));
  size_t version_at = in.pos();
  INFERD_RETURN_IF_ERROR(in.read("version", &version_));
  if (version_ == 1) {
    return in.error(version_at, "GGUF version 1 is not supported (it used 32-bit counts); re-convert the model");
  }
  if (version_ != 2 && version_ != 3) {
    uint32_t swapped = __builtin_bswap32(version_);
    if (swapped == 2 || swapped == 3) {
      return in.error(version_at, "big-endian GGUF version " + std::to_string(swapped) + " is not supported");
    }
    return in.error(version_at, "unsupported GGUF version " + std::to_string(version_) + " (supported: 2, 3)");
  }
  size_t counts_at = in.pos();
  uint64_t n_tensors = 0, n_kv = 0;
  INFERD_RETURN_IF_ERROR(in.read("tensor count", &n_tensors));
  INFERD_RETURN_IF_ERROR(in.read("kv count", &n_kv));
  if (n_tensors > in.left() / kMinTensorInfoBytes) {
    in.short_of(n_tensors <= in.file_left() / kMinTensorInfoBytes);
    return in.error(counts_at, "tensor count " + std::to_string(n_tensors) + " cannot fit in the " +
                                   std::to_string(in.left()) + " bytes left");
  }
  if (n_kv > in.left() / kMinKvBytes) {
    in.short_of(n_kv <= in.file_left() / kMinKvBytes);
    return in.error(counts_at + 8, "kv count " + std::to_string(n_kv) + " cannot fit in the " +
                                       std::to_string(in.left()) + " bytes left");
  }
  uint64_t min_rest = 0;
  if (__builtin_mul_overflow(n_tensors, kMinTensorInfoBytes, &min_rest) ||
      __builtin_add_overflow(min_rest, n_kv * kMinKvBytes, &min_rest) || min_rest > in.left()) {
    in.short_of(min_rest <= in.file_left());
    return in.error(counts_at, std::to_string(n_tensors) + " tensors and " + std::to_string(n_kv) +
                                   " kv pairs cannot fit in the " + std::to_string(in.left()) + " bytes left");
  }

  // Metadata.
  kvs_.reserve(n_kv);
  kv_index_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    size_t kv_at = in.pos();
    std::string what = "kv #" + std::to_string(i);
    std::string_view key;
    INFERD_RETURN_IF_ERROR(in.read_string(what + " key", &key));
    if (key.empty()) return in.error(kv_at, what + ": empty key");
    if (key.size() > kMaxKeyLength) {
      return in.error(kv_at, what + ": key length " + std::to_string(key.size()) + " exceeds " +
                                 std::to_string(kMaxKeyLength));
    }
    what = "key '" + printable(key) + "'";
    if (kv_index_.count(key)) return in.error(kv_at, "duplicate key '" + printable(key) + "'");
    KvEntry kv{key, ValueType::kU8, 0};
    INFERD_RETURN_IF_ERROR(in.read_value_type(what + ": value type", &kv.type));
    kv.value_offset = in.pos();
    if (kv.type == ValueType::kArray) {
      // Peek at the array header (check_value validates it and everything below it).
      INFERD_RETURN_IF_ERROR(in.need(12, what + ": array header"));
      kv.elem_type = static_cast<ValueType>(load<uint32_t>(base_ + kv.value_offset));
      kv.count = load<uint64_t>(base_ + kv.value_offset + 4);
      kv.elems_offset = kv.value_offset + 12;
    }
    INFERD_RETURN_IF_ERROR(in.check_value(kv.type, what, 0));
    kv_index_.emplace(key, kvs_.size());
    kvs_.push_back(kv);
  }

  if (const KvEntry* a = find("general.alignment")) {
    if (!is_integer(a->type)) {
      return in.error(a->value_offset, std::string("general.alignment has type ") + value_type_name(a->type) +
                                           ", expected an integer");
    }
    IntValue v = read_int(base_ + a->value_offset, a->type);
    if (v.negative || v.magnitude_or_value == 0 || !std::has_single_bit(v.magnitude_or_value) ||
        v.magnitude_or_value > (uint64_t{1} << 30)) {
      return in.error(a->value_offset, std::string("general.alignment = ") + (v.negative ? "-" : "") +
                                           std::to_string(v.magnitude_or_value) +
                                           " is not a power of two between 1 and 2^30");
    }
    alignment_ = v.magnitude_or_value;
  }

  // Tensor descriptors.
  tensors_.reserve(n_tensors);
  tensor_index_.reserve(n_tensors);
  std::vector<size_t> info_at(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    size_t at = in.pos();
    info_at[i] = at;
    std::string what = "tensor #" + std::to_string(i);
    std::string_view name;
    INFERD_RETURN_IF_ERROR(in.read_string(what + " name", &name));
    if (name.empty()) return in.error(at, what + ": empty tensor name");
    if (name.size() > kMaxTensorName) {
      return in.error(at, what + ": tensor name '" + printable(name, 40) + "' is " + std::to_string(name.size()) +
                              " bytes long, more than " + std::to_string(kMaxTensorName));
    }
    what = "tensor '" + printable(name) + "'";
    if (tensor_index_.count(name)) return in.error(at, "duplicate tensor name '" + printable(name) + "'");

    TensorInfo t;
    t.name = std::string(name);
    size_t dims_at = in.pos();
    uint32_t n_dims = 0;
    INFERD_RETURN_IF_ERROR(in.read(what + ": n_dims", &n_dims));
    if (n_dims < 1 || n_dims > 4) {
      return in.error(dims_at, what + ": n_dims " + std::to_string(n_dims) + " is not in 1..4");
    }
    t.n_dims = static_cast<int>(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) {
      size_t ne_at = in.pos();
      INFERD_RETURN_IF_ERROR(in.read(what + ": ne[" + std::to_string(d) + "]", &t.ne[d]));
      if (t.ne[d] < 0) {
        return in.error(ne_at, what + ": ne[" + std::to_string(d) + "] = " + std::to_string(t.ne[d]) +
                                   " is negative");
      }
    }
    size_t type_at = in.pos();
    uint32_t raw_type = 0;
    INFERD_RETURN_IF_ERROR(in.read(what + ": type", &raw_type));
    const DTypeInfo* info = dtype_info(raw_type);
    if (info == nullptr) return in.error(type_at, what + ": unknown tensor type " + std::to_string(raw_type));
    t.type = info->type;
    INFERD_RETURN_IF_ERROR(in.read(what + ": data offset", &t.offset));

    int64_t n_elements = 1;
    for (int d = 0; d < 4; ++d) {
      if (__builtin_mul_overflow(n_elements, t.ne[d], &n_elements)) {
        return in.error(dims_at, what + ": element count overflows (shape " + std::to_string(t.ne[0]) + " x " +
                                     std::to_string(t.ne[1]) + " x " + std::to_string(t.ne[2]) + " x " +
                                     std::to_string(t.ne[3]) + ")");
      }
    }
    if (t.ne[0] % info->block_size != 0) {
      return in.error(dims_at, what + ": row length ne[0] = " + std::to_string(t.ne[0]) +
                                   " is not a multiple of the " + info->name + " block size " +
                                   std::to_string(info->block_size));
    }
    uint64_t nbytes = static_cast<uint64_t>(t.ne[0] / info->block_size);
    bool overflow = __builtin_mul_overflow(nbytes, static_cast<uint64_t>(info->block_bytes), &nbytes);
    for (int d = 1; d < 4 && !overflow; ++d) {
      overflow = __builtin_mul_overflow(nbytes, static_cast<uint64_t>(t.ne[d]), &nbytes);
    }
    if (overflow) return in.error(dims_at, what + ": data size in bytes overflows");
    t.nbytes = nbytes;
    tensor_index_.emplace(name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // Tensor data: starts at the first multiple of the alignment after the descriptors.
  size_t infos_end = in.pos();
  if (__builtin_add_overflow(infos_end, alignment_ - 1, &data_offset_)) {
    return in.error(infos_end, "data section offset overflows");
  }
  data_offset_ &= ~(alignment_ - 1);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    TensorInfo& t = tensors_[i];
    std::string what = "tensor '" + printable(t.name) + "'";
    if (t.offset % alignment_ != 0) {
      return in.error(info_at[i], what + ": data offset " + std::to_string(t.offset) +
                                      " is not a multiple of the alignment " + std::to_string(alignment_));
    }
    uint64_t begin = 0, end = 0;
    if (__builtin_add_overflow(data_offset_, t.offset, &begin) || __builtin_add_overflow(begin, t.nbytes, &end) ||
        end > file_size_) {
      return in.error(info_at[i], what + ": data [data section + " + std::to_string(t.offset) + ", +" +
                                      std::to_string(t.nbytes) + " bytes) extends past end of file (data section at " +
                                      std::to_string(data_offset_) + ", file size " + std::to_string(file_size_) + ")");
    }
    t.data = end <= size_ ? base_ + begin : nullptr;  // read_header(): the data is not read
  }
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  const TensorInfo* prev = nullptr;
  for (size_t i : order) {
    const TensorInfo& t = tensors_[i];
    if (t.nbytes == 0) continue;
    if (prev && prev->offset + prev->nbytes > t.offset) {
      return in.error(info_at[i], "tensors '" + printable(prev->name) + "' and '" + printable(t.name) +
                                      "' overlap (data offsets " + std::to_string(prev->offset) + "+" +
                                      std::to_string(prev->nbytes) + " and " + std::to_string(t.offset) + ")");
    }
    prev = &t;
  }
  return Status::ok();
}

// ---- GgufFile: metadata access -----------------------------------------------------------------

const GgufFile::KvEntry* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second];
}

bool GgufFile::has_key(std::string_view key) const { return find(key) != nullptr; }

std::vector<std::string> GgufFile::keys() const {
  std::vector<std::string> out;
  out.reserve(kvs_.size());
  for (const KvEntry& kv : kvs_) out.emplace_back(kv.key);
  return out;
}

ValueType GgufFile::type_of(std::string_view key) const {
  const KvEntry* kv = find(key);
  INFERD_ASSERT(kv != nullptr, "type_of() on a missing key");
  return kv->type;
}

Status GgufFile::type_error(const KvEntry& kv, const char* expected) const {
  std::string type = value_type_name(kv.type);
  if (kv.type == ValueType::kArray) type = type + " of " + value_type_name(kv.elem_type);
  return Status(Code::kCorrupt, path_ + ": key '" + printable(kv.key) + "' has type " + type + ", expected " +
                                    expected + " (at byte offset " + std::to_string(kv.value_offset) + ")");
}

Result<const GgufFile::KvEntry*> GgufFile::find_typed(std::string_view key, ValueType type) const {
  const KvEntry* kv = find(key);
  if (kv == nullptr) return Status(Code::kNotFound, path_ + ": key '" + printable(key) + "' not found");
  if (kv->type != type) return type_error(*kv, value_type_name(type));
  return kv;
}

Result<const GgufFile::KvEntry*> GgufFile::find_array(std::string_view key, const char* expected) const {
  const KvEntry* kv = find(key);
  if (kv == nullptr) return Status(Code::kNotFound, path_ + ": key '" + printable(key) + "' not found");
  if (kv->type != ValueType::kArray) return type_error(*kv, expected);
  return kv;
}

Result<std::string_view> GgufFile::get_string(std::string_view key) const {
  auto kv = find_typed(key, ValueType::kString);
  if (!kv) return kv.status();
  size_t pos = (*kv)->value_offset;
  return ValidatedReader(base_, size_).string_at(&pos);
}

Result<int64_t> GgufFile::get_i64(std::string_view key) const {
  const KvEntry* kv = find(key);
  if (kv == nullptr) return Status(Code::kNotFound, path_ + ": key '" + printable(key) + "' not found");
  if (!is_integer(kv->type)) return type_error(*kv, "an integer");
  IntValue v = read_int(base_ + kv->value_offset, kv->type);
  if (v.negative) {
    return v.magnitude_or_value == uint64_t{1} << 63 ? std::numeric_limits<int64_t>::min()
                                                     : -static_cast<int64_t>(v.magnitude_or_value);
  }
  if (v.magnitude_or_value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Status(Code::kCorrupt, path_ + ": key '" + printable(key) + "' value " +
                                      std::to_string(v.magnitude_or_value) + " does not fit in i64");
  }
  return static_cast<int64_t>(v.magnitude_or_value);
}

Result<uint32_t> GgufFile::get_u32(std::string_view key) const {
  const KvEntry* kv = find(key);
  if (kv == nullptr) return Status(Code::kNotFound, path_ + ": key '" + printable(key) + "' not found");
  if (!is_integer(kv->type)) return type_error(*kv, "an integer");
  IntValue v = read_int(base_ + kv->value_offset, kv->type);
  if (v.negative || v.magnitude_or_value > std::numeric_limits<uint32_t>::max()) {
    return Status(Code::kCorrupt, path_ + ": key '" + printable(key) + "' value " + value_to_string(key) +
                                      " does not fit in u32");
  }
  return static_cast<uint32_t>(v.magnitude_or_value);
}

Result<float> GgufFile::get_f32(std::string_view key) const {
  const KvEntry* kv = find(key);
  if (kv == nullptr) return Status(Code::kNotFound, path_ + ": key '" + printable(key) + "' not found");
  const uint8_t* p = base_ + kv->value_offset;
  if (kv->type == ValueType::kF32) return load<float>(p);
  if (kv->type == ValueType::kF64) return static_cast<float>(load<double>(p));
  if (is_integer(kv->type)) {
    IntValue v = read_int(p, kv->type);
    float f = static_cast<float>(v.magnitude_or_value);
    return v.negative ? -f : f;
  }
  return type_error(*kv, "a number");
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
  auto kv = find_typed(key, ValueType::kBool);
  if (!kv) return kv.status();
  return base_[(*kv)->value_offset] != 0;
}

Result<ArrayInfo> GgufFile::get_array_info(std::string_view key) const {
  auto kv = find_array(key, "array");
  if (!kv) return kv.status();
  return ArrayInfo{(*kv)->elem_type, (*kv)->count};
}

Result<std::vector<std::string_view>> GgufFile::get_string_array(std::string_view key) const {
  auto kv = find_array(key, "array of string");
  if (!kv) return kv.status();
  if ((*kv)->elem_type != ValueType::kString) return type_error(**kv, "array of string");
  ValidatedReader reader(base_, size_);
  std::vector<std::string_view> out;
  out.reserve((*kv)->count);  // bounded by the file size (parse() checked it)
  size_t pos = (*kv)->elems_offset;
  for (uint64_t i = 0; i < (*kv)->count; ++i) out.push_back(reader.string_at(&pos));
  return out;
}

Result<std::vector<float>> GgufFile::get_f32_array(std::string_view key) const {
  auto kv = find_array(key, "array of f32");
  if (!kv) return kv.status();
  ValueType elem = (*kv)->elem_type;
  if (elem != ValueType::kF32 && elem != ValueType::kF64) return type_error(**kv, "array of f32");
  std::vector<float> out((*kv)->count);
  const uint8_t* p = base_ + (*kv)->elems_offset;
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = elem == ValueType::kF32 ? load<float>(p + 4 * i) : static_cast<float>(load<double>(p + 8 * i));
  }
  return out;
}

Result<std::vector<int32_t>> GgufFile::get_i32_array(std::string_view key) const {
  auto kv = find_array(key, "array of i32");
  if (!kv) return kv.status();
  ValueType elem = (*kv)->elem_type;
  if (!is_integer(elem)) return type_error(**kv, "array of i32");
  size_t sz = scalar_size(elem);
  std::vector<int32_t> out((*kv)->count);
  const uint8_t* p = base_ + (*kv)->elems_offset;
  for (size_t i = 0; i < out.size(); ++i) {
    IntValue v = read_int(p + sz * i, elem);
    uint64_t limit = v.negative ? uint64_t{1} << 31 : (uint64_t{1} << 31) - 1;
    if (v.magnitude_or_value > limit) {
      return Status(Code::kCorrupt, path_ + ": key '" + printable(key) + "' element " + std::to_string(i) +
                                        " does not fit in i32");
    }
    out[i] = v.negative ? static_cast<int32_t>(-static_cast<int64_t>(v.magnitude_or_value))
                        : static_cast<int32_t>(v.magnitude_or_value);
  }
  return out;
}

std::string GgufFile::value_to_string(std::string_view key, size_t max_len) const {
  const KvEntry* kv = find(key);
  INFERD_ASSERT(kv != nullptr, "value_to_string() on a missing key");
  std::string out;
  size_t pos = kv->value_offset;
  ValidatedReader(base_, size_).append(out, kv->type, &pos, max_len);
  return out;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace inferd::gguf
