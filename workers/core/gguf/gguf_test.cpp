#include "inferd/gguf.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace inferd::gguf {
namespace {

// Writes small GGUF files in memory: metadata first, then tensor descriptors, then aligned data.
class Builder {
 public:
  explicit Builder(uint32_t version = 3) : version_(version) {}

  Builder& kv_u8(const std::string& k, uint8_t v) { return scalar(k, ValueType::kU8, &v, 1); }
  Builder& kv_i8(const std::string& k, int8_t v) { return scalar(k, ValueType::kI8, &v, 1); }
  Builder& kv_u16(const std::string& k, uint16_t v) { return scalar(k, ValueType::kU16, &v, 2); }
  Builder& kv_i16(const std::string& k, int16_t v) { return scalar(k, ValueType::kI16, &v, 2); }
  Builder& kv_u32(const std::string& k, uint32_t v) { return scalar(k, ValueType::kU32, &v, 4); }
  Builder& kv_i32(const std::string& k, int32_t v) { return scalar(k, ValueType::kI32, &v, 4); }
  Builder& kv_u64(const std::string& k, uint64_t v) { return scalar(k, ValueType::kU64, &v, 8); }
  Builder& kv_i64(const std::string& k, int64_t v) { return scalar(k, ValueType::kI64, &v, 8); }
  Builder& kv_f32(const std::string& k, float v) { return scalar(k, ValueType::kF32, &v, 4); }
  Builder& kv_f64(const std::string& k, double v) { return scalar(k, ValueType::kF64, &v, 8); }
  Builder& kv_bool(const std::string& k, bool v) {
    uint8_t b = v;
    return scalar(k, ValueType::kBool, &b, 1);
  }
  Builder& kv_string(const std::string& k, const std::string& v) {
    key(k, ValueType::kString);
    str(kv_, v);
    ++n_kv_;
    return *this;
  }
  Builder& kv_string_array(const std::string& k, const std::vector<std::string>& v) {
    key(k, ValueType::kArray);
    u32(kv_, static_cast<uint32_t>(ValueType::kString));
    u64(kv_, v.size());
    for (const auto& s : v) str(kv_, s);
    ++n_kv_;
    return *this;
  }
  template <typename T>
  Builder& kv_array(const std::string& k, ValueType elem, const std::vector<T>& v) {
    key(k, ValueType::kArray);
    u32(kv_, static_cast<uint32_t>(elem));
    u64(kv_, v.size());
    for (const T& x : v) raw(kv_, &x, sizeof(T));
    ++n_kv_;
    return *this;
  }
  // [[1, 2], [3]] as u16 arrays inside an array.
  Builder& kv_nested(const std::string& k) {
    key(k, ValueType::kArray);
    u32(kv_, static_cast<uint32_t>(ValueType::kArray));
    u64(kv_, 2);
    std::vector<std::vector<uint16_t>> inner = {{1, 2}, {3}};
    for (const auto& a : inner) {
      u32(kv_, static_cast<uint32_t>(ValueType::kU16));
      u64(kv_, a.size());
      for (uint16_t x : a) raw(kv_, &x, 2);
    }
    ++n_kv_;
    return *this;
  }

  Builder& tensor(const std::string& name, DType type, std::vector<int64_t> ne, std::vector<uint8_t> data) {
    tensors_.push_back({name, type, std::move(ne), std::move(data)});
    return *this;
  }

  std::vector<uint8_t> build(size_t alignment = kDefaultAlignment) const {
    std::vector<uint8_t> out;
    raw(out, "GGUF", 4);
    u32(out, version_);
    u64(out, tensors_.size());
    u64(out, n_kv_);
    out.insert(out.end(), kv_.begin(), kv_.end());
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
      str(out, t.name);
      u32(out, static_cast<uint32_t>(t.ne.size()));
      for (int64_t n : t.ne) raw(out, &n, 8);
      u32(out, static_cast<uint32_t>(t.type));
      u64(out, offset);
      offset += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    out.resize((out.size() + alignment - 1) / alignment * alignment, 0);
    for (const auto& t : tensors_) {
      out.insert(out.end(), t.data.begin(), t.data.end());
      out.resize((out.size() + alignment - 1) / alignment * alignment, 0);
    }
    return out;
  }

 private:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> data;
  };
  static void raw(std::vector<uint8_t>& out, const void* p, size_t n) {
    auto b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  }
  static void u32(std::vector<uint8_t>& out, uint32_t v) { raw(out, &v, 4); }
  static void u64(std::vector<uint8_t>& out, uint64_t v) { raw(out, &v, 8); }
  static void str(std::vector<uint8_t>& out, const std::string& s) {
    u64(out, s.size());
    raw(out, s.data(), s.size());
  }
  void key(const std::string& k, ValueType t) {
    str(kv_, k);
    u32(kv_, static_cast<uint32_t>(t));
  }
  Builder& scalar(const std::string& k, ValueType t, const void* p, size_t n) {
    key(k, t);
    raw(kv_, p, n);
    ++n_kv_;
    return *this;
  }

  uint32_t version_;
  uint64_t n_kv_ = 0;
  std::vector<uint8_t> kv_;
  std::vector<Tensor> tensors_;
};

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

Builder sample_builder(uint32_t version = 3) {
  Builder b(version);
  b.kv_string("general.architecture", "llama")
      .kv_u8("t.u8", 200)
      .kv_i8("t.i8", -5)
      .kv_u16("t.u16", 60000)
      .kv_i16("t.i16", -30000)
      .kv_u32("t.u32", 4000000000u)
      .kv_i32("t.i32", -7)
      .kv_u64("t.u64", 1ull << 40)
      .kv_i64("t.i64", -(1ll << 40))
      .kv_f32("t.f32", 1.5f)
      .kv_f64("t.f64", 0.25)
      .kv_bool("t.true", true)
      .kv_bool("t.false", false)
      .kv_string("t.quote", "a\"b\nc")
      .kv_string_array("t.tokens", {"<s>", "hello", "", "world"})
      .kv_array<float>("t.scores", ValueType::kF32, {0.5f, -1.0f, 2.0f})
      .kv_array<int32_t>("t.types", ValueType::kI32, {1, 2, 3, -4})
      .kv_array<uint8_t>("t.bools", ValueType::kBool, {1, 0, 1})
      .kv_array<uint64_t>("t.big", ValueType::kU64, {1, 1ull << 33})
      .kv_nested("t.nested");
  b.tensor("a.weight", DType::kF32, {4, 3}, pattern(48, 1))
      .tensor("b.weight", DType::kQ8_0, {64, 2}, pattern(4 * 34, 2))
      .tensor("c.weight", DType::kQ4_1, {32}, pattern(20, 3));
  return b;
}

std::unique_ptr<GgufFile> open_buffer(std::vector<uint8_t> bytes) {
  auto f = GgufFile::from_buffer(std::move(bytes), "mem.gguf");
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  return f.is_ok() ? std::move(f).value() : nullptr;
}

TEST(GgufTest, ReadsScalarValues) {
  auto f = open_buffer(sample_builder().build());
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->get_string("general.architecture").value(), "llama");
  EXPECT_EQ(f->get_u32("t.u8").value(), 200u);
  EXPECT_EQ(f->get_i64("t.i8").value(), -5);
  EXPECT_EQ(f->get_u32("t.u16").value(), 60000u);
  EXPECT_EQ(f->get_i64("t.i16").value(), -30000);
  EXPECT_EQ(f->get_u32("t.u32").value(), 4000000000u);
  EXPECT_EQ(f->get_i64("t.u32").value(), 4000000000);
  EXPECT_EQ(f->get_i64("t.u64").value(), 1ll << 40);
  EXPECT_EQ(f->get_i64("t.i64").value(), -(1ll << 40));
  EXPECT_EQ(f->get_f32("t.f32").value(), 1.5f);
  EXPECT_EQ(f->get_f32("t.f64").value(), 0.25f);
  EXPECT_EQ(f->get_f32("t.i32").value(), -7.0f);
  EXPECT_TRUE(f->get_bool("t.true").value());
  EXPECT_FALSE(f->get_bool("t.false").value());
  EXPECT_EQ(f->type_of("t.i16"), ValueType::kI16);
  EXPECT_EQ(f->type_of("t.tokens"), ValueType::kArray);
}

TEST(GgufTest, IntegerGettersRejectValuesThatDoNotFit) {
  auto f = open_buffer(sample_builder().build());
  ASSERT_NE(f, nullptr);
  auto neg = f->get_u32("t.i32");
  EXPECT_EQ(neg.status().code(), Code::kCorrupt);
  EXPECT_NE(neg.status().message().find("t.i32"), std::string::npos);
  EXPECT_EQ(f->get_u32("t.u64").status().code(), Code::kCorrupt);
  EXPECT_EQ(f->get_i32_array("t.big").status().code(), Code::kCorrupt);
}

TEST(GgufTest, GetterErrors) {
  auto f = open_buffer(sample_builder().build());
  ASSERT_NE(f, nullptr);
  auto missing = f->get_u32("no.such.key");
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_NE(missing.status().message().find("no.such.key"), std::string::npos);
  EXPECT_FALSE(f->has_key("no.such.key"));

  auto wrong = f->get_string("t.u32");
  EXPECT_EQ(wrong.status().code(), Code::kCorrupt);
  EXPECT_NE(wrong.status().message().find("'t.u32' has type u32, expected string"), std::string::npos)
      << wrong.status().message();
  EXPECT_EQ(f->get_u32("general.architecture").status().code(), Code::kCorrupt);
  EXPECT_EQ(f->get_f32("t.true").status().code(), Code::kCorrupt);
  EXPECT_EQ(f->get_bool("t.u8").status().code(), Code::kCorrupt);
  EXPECT_EQ(f->get_string_array("t.scores").status().code(), Code::kCorrupt);
  EXPECT_EQ(f->get_string_array("t.u8").status().code(), Code::kCorrupt);
  EXPECT_EQ(f->get_f32_array("t.tokens").status().code(), Code::kCorrupt);
  EXPECT_EQ(f->get_i32_array("t.scores").status().code(), Code::kCorrupt);
  EXPECT_EQ(f->get_array_info("t.u8").status().code(), Code::kCorrupt);
  EXPECT_EQ(f->get_array_info("nope").status().code(), Code::kNotFound);
}

TEST(GgufTest, ReadsArrays) {
  auto f = open_buffer(sample_builder().build());
  ASSERT_NE(f, nullptr);
  auto tokens = f->get_string_array("t.tokens");
  ASSERT_TRUE(tokens.is_ok());
  EXPECT_EQ(tokens.value(), (std::vector<std::string_view>{"<s>", "hello", "", "world"}));
  // Views point into the file, not into copies.
  const char* p = tokens.value()[1].data();
  EXPECT_TRUE(p > reinterpret_cast<const char*>(f->data()) &&
              p < reinterpret_cast<const char*>(f->data() + f->file_size()));
  EXPECT_EQ(f->get_f32_array("t.scores").value(), (std::vector<float>{0.5f, -1.0f, 2.0f}));
  EXPECT_EQ(f->get_i32_array("t.types").value(), (std::vector<int32_t>{1, 2, 3, -4}));
  EXPECT_EQ(f->get_i32_array("t.bools").status().code(), Code::kCorrupt);
  ArrayInfo info = f->get_array_info("t.tokens").value();
  EXPECT_EQ(info.elem_type, ValueType::kString);
  EXPECT_EQ(info.count, 4u);
  EXPECT_EQ(f->get_array_info("t.nested").value().elem_type, ValueType::kArray);
}

TEST(GgufTest, KeysInFileOrder) {
  auto f = open_buffer(sample_builder().build());
  ASSERT_NE(f, nullptr);
  auto keys = f->keys();
  ASSERT_EQ(keys.size(), 20u);
  EXPECT_EQ(keys.front(), "general.architecture");
  EXPECT_EQ(keys[1], "t.u8");
  EXPECT_EQ(keys.back(), "t.nested");
}

TEST(GgufTest, ValueToString) {
  auto f = open_buffer(sample_builder().build());
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->value_to_string("general.architecture"), "\"llama\"");
  EXPECT_EQ(f->value_to_string("t.quote"), "\"a\\\"b\\nc\"");
  EXPECT_EQ(f->value_to_string("t.i64"), "-1099511627776");
  EXPECT_EQ(f->value_to_string("t.f32"), "1.5");
  EXPECT_EQ(f->value_to_string("t.true"), "true");
  EXPECT_EQ(f->value_to_string("t.tokens"), "[\"<s>\", \"hello\", \"\", \"world\"]");
  EXPECT_EQ(f->value_to_string("t.bools"), "[true, false, true]");
  EXPECT_EQ(f->value_to_string("t.nested"), "[[1, 2], [3]]");
  std::string short_form = f->value_to_string("t.tokens", 8);
  EXPECT_NE(short_form.find("... (4 items)]"), std::string::npos) << short_form;
}

TEST(GgufTest, TensorDescriptors) {
  auto bytes = sample_builder().build();
  auto f = open_buffer(bytes);
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->data_offset() % 32, 0u);
  const TensorInfo* a = f->find_tensor("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->n_dims, 2);
  EXPECT_EQ(a->ne[0], 4);
  EXPECT_EQ(a->ne[1], 3);
  EXPECT_EQ(a->ne[2], 1);
  EXPECT_EQ(a->n_elements(), 12);
  EXPECT_EQ(a->type, DType::kF32);
  EXPECT_EQ(a->nbytes, 48u);
  EXPECT_EQ(a->offset, 0u);
  EXPECT_EQ(a->data, f->data() + f->data_offset());
  EXPECT_EQ(std::memcmp(a->data, pattern(48, 1).data(), 48), 0);

  const TensorInfo* b = f->find_tensor("b.weight");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, DType::kQ8_0);
  EXPECT_EQ(b->nbytes, 4u * 34u);
  EXPECT_EQ(b->offset, 64u);
  EXPECT_EQ(std::memcmp(b->data, pattern(4 * 34, 2).data(), 4 * 34), 0);

  const TensorInfo* c = f->find_tensor("c.weight");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->n_dims, 1);
  EXPECT_EQ(c->type, DType::kQ4_1);
  EXPECT_EQ(c->nbytes, 20u);
  EXPECT_EQ(f->find_tensor("missing"), nullptr);
  EXPECT_EQ(f->find_tensor("a.weigh"), nullptr);
}

TEST(GgufTest, AcceptsVersion2) {
  auto f = open_buffer(sample_builder(2).build());
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->tensors().size(), 3u);
}

TEST(GgufTest, RejectsVersion1WithClearMessage) {
  auto r = GgufFile::from_buffer(sample_builder(1).build(), "old.gguf");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
  EXPECT_NE(r.status().message().find("old.gguf: GGUF version 1 is not supported"), std::string::npos)
      << r.status().message();
}

TEST(GgufTest, HonoursCustomAlignment) {
  Builder b;
  b.kv_u32("general.alignment", 64);
  b.tensor("x", DType::kF32, {3}, pattern(12, 4)).tensor("y", DType::kF32, {5}, pattern(20, 5));
  auto f = open_buffer(b.build(64));
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  EXPECT_EQ(f->find_tensor("y")->offset, 64u);
  EXPECT_EQ(std::memcmp(f->find_tensor("y")->data, pattern(20, 5).data(), 20), 0);
}

TEST(GgufTest, AllowsZeroSizedTensorsAsLlamaCppDoes) {
  Builder b;
  b.tensor("empty", DType::kF32, {0, 4}, {}).tensor("x", DType::kF32, {2}, pattern(8, 1));
  auto f = open_buffer(b.build());
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->find_tensor("empty")->nbytes, 0u);
  EXPECT_EQ(f->find_tensor("empty")->n_elements(), 0);
}

TEST(GgufTest, NoTensorsNoMetadata) {
  auto f = open_buffer(Builder().build());
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_TRUE(f->keys().empty());
}

TEST(GgufTest, OpenMapsAFile) {
  auto bytes = sample_builder().build();
  std::string path = testing::TempDir() + "gguf_test_" + std::to_string(::getpid()) + ".gguf";
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  auto f = GgufFile::open(path);
  std::remove(path.c_str());  // the mapping outlives the directory entry
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ((*f)->path(), path);
  EXPECT_EQ((*f)->file_size(), bytes.size());
  EXPECT_EQ((*f)->get_string("general.architecture").value(), "llama");
  EXPECT_EQ(std::memcmp((*f)->find_tensor("c.weight")->data, pattern(20, 3).data(), 20), 0);
}

// read_header() parses what open() parses from a pread prefix, growing it past 1 MiB of metadata, and
// leaves the data unread; a file cut inside its metadata is a clean error (there is no mapping to fault).
TEST(GgufTest, ReadHeaderParsesThePrefixWithoutMapping) {
  std::vector<std::string> vocab(70000);
  for (size_t i = 0; i < vocab.size(); ++i) vocab[i] = "token-" + std::to_string(i) + std::string(16, 'x');
  auto bytes = sample_builder().kv_string_array("tokenizer.ggml.tokens", vocab).build();  // ~2 MiB
  ASSERT_GT(bytes.size(), size_t{1} << 21);
  const std::string path = testing::TempDir() + "gguf_header_" + std::to_string(::getpid()) + ".gguf";
  auto write = [&](size_t n) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(n));
  };
  write(bytes.size());
  auto mapped = GgufFile::open(path);
  auto header = GgufFile::read_header(path);
  ASSERT_TRUE(mapped.is_ok()) << mapped.status().to_string();
  ASSERT_TRUE(header.is_ok()) << header.status().to_string();
  EXPECT_EQ((*header)->file_size(), bytes.size());
  EXPECT_EQ((*header)->data_offset(), (*mapped)->data_offset());
  EXPECT_EQ((*header)->keys(), (*mapped)->keys());
  EXPECT_EQ((*header)->get_string_array("tokenizer.ggml.tokens").value().back(), vocab.back());
  ASSERT_EQ((*header)->tensors().size(), (*mapped)->tensors().size());
  for (size_t i = 0; i < (*header)->tensors().size(); ++i) {
    const TensorInfo& a = (*header)->tensors()[i];
    const TensorInfo& b = (*mapped)->tensors()[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.offset, b.offset);
    EXPECT_EQ(a.nbytes, b.nbytes);
    EXPECT_EQ(a.data, nullptr);  // not read
  }
  // Cut inside the vocabulary: truncated, said so, at whatever prefix size.
  write(bytes.size() / 2);
  auto cut = GgufFile::read_header(path);
  ASSERT_FALSE(cut.is_ok());
  EXPECT_EQ(cut.status().code(), Code::kCorrupt);
  EXPECT_NE(cut.status().message().find("tokenizer.ggml.tokens"), std::string::npos) << cut.status().to_string();
  // A tensor count no file of this size can hold is corrupt at once (not a reason to read more).
  write(bytes.size());
  std::vector<uint8_t> absurd = bytes;
  const uint64_t n = uint64_t{1} << 40;
  std::memcpy(absurd.data() + 8, &n, 8);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(absurd.data()), static_cast<std::streamsize>(absurd.size()));
  }
  auto bad = GgufFile::read_header(path);
  ::unlink(path.c_str());
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("tensor count"), std::string::npos) << bad.status().to_string();
  EXPECT_EQ(GgufFile::read_header("/nonexistent/model.gguf").status().code(), Code::kNotFound);
  EXPECT_EQ(GgufFile::read_header(testing::TempDir()).status().code(), Code::kInvalidArgument);
}

TEST(GgufTest, MissingFileIsNotFound) {
  auto f = GgufFile::open("/nonexistent/dir/model.gguf");
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().code(), Code::kNotFound);
  EXPECT_NE(f.status().message().find("/nonexistent/dir/model.gguf"), std::string::npos);
}

TEST(GgufTest, DirectoryIsInvalidArgument) {
  auto f = GgufFile::open(testing::TempDir());
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().code(), Code::kInvalidArgument);
}

// A FIFO is refused as not a regular file at once: opened without waiting for a writer (a plain open
// would block here, and the test would time out), and never read.
TEST(GgufTest, FifoIsInvalidArgumentWithoutBlocking) {
  const std::string path = testing::TempDir() + "gguf_fifo_" + std::to_string(::getpid()) + ".gguf";
  ::unlink(path.c_str());
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << std::strerror(errno);
  auto f = GgufFile::open(path);
  ::unlink(path.c_str());
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().code(), Code::kInvalidArgument);
  EXPECT_NE(f.status().message().find("not a regular file"), std::string::npos) << f.status().to_string();
}

// A file that is not GGUF: the error says so without quoting the bytes it found (a client that names a
// file must not learn how it starts).
TEST(GgufTest, NotGgufDoesNotQuoteTheFile) {
  const std::string path = testing::TempDir() + "gguf_text_" + std::to_string(::getpid()) + ".gguf";
  {
    std::ofstream out(path, std::ios::binary);
    out << "root:x:0:0:root:/root:/bin/bash\n";
  }
  auto f = GgufFile::open(path);
  ::unlink(path.c_str());
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().code(), Code::kCorrupt) << f.status().to_string();
  EXPECT_NE(f.status().message().find("not a GGUF file"), std::string::npos) << f.status().to_string();
  EXPECT_EQ(f.status().message().find("root"), std::string::npos) << f.status().to_string();
}

TEST(GgufTest, ErrorsNameTheKeyAndOffset) {
  Builder b;
  b.kv_u32("general.alignment", 48);
  auto r = GgufFile::from_buffer(b.build(), "x.gguf");
  ASSERT_FALSE(r.is_ok());
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("x.gguf: general.alignment = 48 is not a power of two"), std::string::npos) << m;
  EXPECT_NE(m.find("at byte offset "), std::string::npos) << m;
}

const char* const kModel = INFERD_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

TEST(GgufModelTest, OpensSmolLM2) {
  if (!std::filesystem::exists(kModel)) GTEST_SKIP() << "model not present: " << kModel;
  auto start = std::chrono::steady_clock::now();
  auto r = GgufFile::open(kModel);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const GgufFile& f = *r.value();
  std::printf("opened %s in %.2f ms\n", kModel, ms);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.keys().size(), 33u);
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.get_string("general.architecture").value(), "llama");
  EXPECT_EQ(f.get_string("tokenizer.ggml.model").value(), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre").value(), "smollm");
  EXPECT_EQ(f.get_u32("llama.block_count").value(), 30u);
  EXPECT_EQ(f.get_u32("llama.embedding_length").value(), 576u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count").value(), 9u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count_kv").value(), 3u);
  EXPECT_EQ(f.get_u32("llama.feed_forward_length").value(), 1536u);
  EXPECT_GT(f.get_f32("llama.attention.layer_norm_rms_epsilon").value(), 0.0f);
  auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.is_ok());
  EXPECT_EQ(tokens.value().size(), 49152u);
  EXPECT_EQ(tokens.value()[0], "<|endoftext|>");
  EXPECT_EQ(f.get_i32_array("tokenizer.ggml.token_type").value().size(), 49152u);
  EXPECT_GT(f.get_string_array("tokenizer.ggml.merges").value().size(), 0u);

  const TensorInfo* emb = f.find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, DType::kQ8_0);
  EXPECT_EQ(emb->ne[0], 576);
  EXPECT_EQ(emb->ne[1], 49152);
  EXPECT_EQ(emb->nbytes, size_t{576} / 32 * 34 * 49152);
  int q4_1 = 0, f32 = 0;
  size_t total = 0;
  for (const TensorInfo& t : f.tensors()) {
    q4_1 += t.type == DType::kQ4_1;
    f32 += t.type == DType::kF32;
    total += t.nbytes;
  }
  EXPECT_EQ(q4_1, 210);
  EXPECT_EQ(f32, 61);
  EXPECT_LE(f.data_offset() + total, f.file_size());
  EXPECT_EQ(f.find_tensor("blk.0.attn_q.weight")->type, DType::kQ4_1);
}

}  // namespace
}  // namespace inferd::gguf
