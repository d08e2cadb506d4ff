#include "inferd/ipc/weights_segment.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <utility>

#include "inferd/model.h"
#include "inferd/testing/scoped_env.h"
#include "inferd/weight_layout.h"

namespace inferd::ipc {
namespace {

const std::string kModel = std::string(INFERD_TEST_DATA_DIR) + "/models/mixed-small.gguf";

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

using inferd::testing::ScopedEnv;

// The checks both layouts share: header, table, alignment, a model that loads.
void expect_valid_copy(const WeightsSegment& s, const std::vector<uint8_t>& file) {
  const WeightsHeader& h = s.header();
  EXPECT_EQ(0, std::memcmp(h.magic, kWeightsMagic, 8));
  EXPECT_EQ(h.gguf_bytes, file.size());
  EXPECT_EQ(h.data_offset % kHugePageBytes, 0u);
  EXPECT_EQ(h.segment_bytes, s.size());
  EXPECT_STREQ(h.source_path, kModel.c_str());
  // The table names every tensor at its place in the image, with the layout the parsed image reports.
  ASSERT_EQ(h.tensor_count, s.gguf()->tensors().size());
  for (uint32_t i = 0; i < h.tensor_count; ++i) {
    const gguf::TensorInfo& t = s.gguf()->tensors()[i];
    EXPECT_EQ(s.tensors()[i].name, t.name);
    EXPECT_EQ(s.data() + s.tensors()[i].offset, t.data);
    EXPECT_EQ(s.tensors()[i].layout, static_cast<uint32_t>(t.layout)) << t.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 32, 0u) << t.name;
  }
  // A model loads from it without touching the file.
  auto model = Model::load(s.gguf());
  ASSERT_TRUE(model) << model.status().to_string();
}

TEST(WeightsSegment, WithRowsLayoutCopiesTheFileByteForByteWithHugePageAlignedData) {
  ScopedEnv rows("INFERD_WEIGHTS_LAYOUT", "rows");
  uint64_t last_done = 0, calls = 0;
  auto seg = WeightsSegment::create(kModel, [&](std::string_view stage, uint64_t done, uint64_t total) {
    EXPECT_EQ(stage, "copying");
    EXPECT_GT(done, last_done);
    EXPECT_LE(done, total);
    last_done = done;
    ++calls;
  });
  ASSERT_TRUE(seg) << seg.status().to_string();
  const WeightsSegment& s = *seg.value();
  std::vector<uint8_t> file = read_file(kModel);
  EXPECT_EQ(last_done, file.size());
  EXPECT_GE(calls, 1u);
  EXPECT_EQ(0, std::memcmp(s.data() + s.header().gguf_offset, file.data(), file.size()));
  expect_valid_copy(s, file);
  for (uint32_t i = 0; i < s.header().tensor_count; ++i) EXPECT_EQ(s.tensors()[i].layout, 0u);
}

// By default the Q4_0/Q4_1/Q8_0 matrices are interleaved: every other byte is the file's, and each
// interleaved matrix deinterleaves to the file's bytes.
TEST(WeightsSegment, InterleavesTheMatricesItCanAndKeepsEverythingElse) {
  auto seg = WeightsSegment::create(kModel, nullptr);
  ASSERT_TRUE(seg) << seg.status().to_string();
  const WeightsSegment& s = *seg.value();
  const std::vector<uint8_t> file = read_file(kModel);
  expect_valid_copy(s, file);
  std::vector<uint8_t> image(s.data() + s.header().gguf_offset, s.data() + s.header().gguf_offset + file.size());
  int interleaved = 0;
  for (const gguf::TensorInfo& t : s.gguf()->tensors()) {
    const size_t at = s.gguf()->data_offset() + t.offset;
    const bool expect = t.n_dims == 2 && layout_fits(WeightLayout::kInterleaved16, t.type, t.ne[1], t.ne[0]);
    EXPECT_EQ(t.layout == WeightLayout::kInterleaved16, expect) << t.name;
    if (t.layout != WeightLayout::kInterleaved16) continue;
    ++interleaved;
    EXPECT_NE(0, std::memcmp(image.data() + at, file.data() + at, t.nbytes)) << t.name;
    deinterleave_groups(t.type, t.ne[0], t.ne[1] / kInterleaveRows, s.data() + s.header().gguf_offset + at,
                        image.data() + at);
  }
  EXPECT_GT(interleaved, 0);
  EXPECT_EQ(0, std::memcmp(image.data(), file.data(), file.size()));
}

// The daemon forks workers on one thread while another creates a segment. A child forked while create() writes
// through its writable mappings (here: in the middle of the interleaving, and kept alive until create() has
// returned) must not inherit them, or sealing fails with EBUSY for as long as the child lives.
TEST(WeightsSegment, AChildForkedDuringCreationDoesNotBlockTheSeal) {
  int release[2];
  ASSERT_EQ(0, ::pipe2(release, O_CLOEXEC));
  pid_t child = -1;
  uint64_t interleaving_calls = 0;
  auto seg = WeightsSegment::create(kModel, [&](std::string_view stage, uint64_t done, uint64_t total) {
    EXPECT_LE(done, total);
    if (stage != "interleaving") return;
    ++interleaving_calls;
    if (child >= 0) return;
    child = ::fork();
    if (child == 0) {  // only async-signal-safe calls: wait for the parent, then leave
      char c;
      (void)!::read(release[0], &c, 1);
      ::_exit(0);
    }
  });
  ASSERT_GT(child, 0) << "create() reported no interleaving stage";
  (void)!::write(release[1], "x", 1);
  int status = 0;
  ASSERT_EQ(child, ::waitpid(child, &status, 0));
  ::close(release[0]);
  ::close(release[1]);
  EXPECT_GT(interleaving_calls, 0u);
  ASSERT_TRUE(seg) << seg.status().to_string();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(WeightsSegment, RefusesAnUnknownLayoutSetting) {
  ScopedEnv bad("INFERD_WEIGHTS_LAYOUT", "tiled");
  auto seg = WeightsSegment::create(kModel, nullptr);
  ASSERT_FALSE(seg);
  EXPECT_EQ(seg.status().code(), Code::kInvalidArgument);
  EXPECT_NE(seg.status().message().find("INFERD_WEIGHTS_LAYOUT"), std::string::npos) << seg.status().to_string();
}

TEST(WeightsSegment, MapsTheDataAt2MiBAlignedAddressesAndSharesItsHugePages) {
  auto seg = WeightsSegment::create(kModel, nullptr);
  ASSERT_TRUE(seg) << seg.status().to_string();
  const WeightsSegment& s = *seg.value();
  const WeightsHeader& h = s.header();
  // Aligned mapping: a 2 MiB page of the memfd lands on a 2 MiB page of the address space.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data()) % kHugePageBytes, 0u);
  const uint64_t whole_pages = (s.size() - h.data_offset) / kHugePageBytes * kHugePageBytes;
  const uint64_t huge = s.huge_page_bytes();
  EXPECT_LE(huge, whole_pages);
  EXPECT_EQ(huge % kHugePageBytes, 0u);
  // A worker attaching the same memfd maps the same huge pages (it does not copy or collapse again).
  UniqueFd dup(::fcntl(s.fd(), F_DUPFD_CLOEXEC, 0));
  auto other = WeightsSegment::attach(std::move(dup));
  ASSERT_TRUE(other) << other.status().to_string();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(other.value()->data()) % kHugePageBytes, 0u);
  EXPECT_EQ(0, std::memcmp(other.value()->data(), s.data(), s.size()));
  if (huge == 0) GTEST_SKIP() << "this kernel backs no shmem with 2 MiB pages (no MADV_COLLAPSE, or THP 'deny')";
  // The collapse is best effort per 2 MiB (a fragmented memory can refuse a few), so no exact count;
  // but what the first mapping got, the second maps too (or more, if its own collapse filled a gap).
  EXPECT_GE(other.value()->huge_page_bytes(), huge);
}

TEST(WeightsSegment, IsSealedAgainstWritesAndResizing) {
  auto seg = WeightsSegment::create(kModel, nullptr);
  ASSERT_TRUE(seg) << seg.status().to_string();
  int fd = seg.value()->fd();
  char byte = 1;
  EXPECT_EQ(-1, ::pwrite(fd, &byte, 1, 0));
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(0, ::ftruncate(fd, 4096));
  void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  EXPECT_EQ(p, MAP_FAILED);
}

TEST(WeightsSegment, AttachingAnotherFdSharesTheSamePages) {
  auto seg = WeightsSegment::create(kModel, nullptr);
  ASSERT_TRUE(seg) << seg.status().to_string();
  auto again = WeightsSegment::attach(UniqueFd(::dup(seg.value()->fd())));
  ASSERT_TRUE(again) << again.status().to_string();
  EXPECT_EQ(again.value()->size(), seg.value()->size());
  EXPECT_EQ(0, std::memcmp(again.value()->data(), seg.value()->data(), seg.value()->size()));
}

TEST(WeightsSegment, ReportsFileErrors) {
  auto missing = WeightsSegment::create("/nonexistent/model.gguf", nullptr);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  auto not_gguf = WeightsSegment::create(std::string(INFERD_TEST_DATA_DIR) + "/text/english.txt", nullptr);
  ASSERT_FALSE(not_gguf);
  EXPECT_EQ(not_gguf.status().code(), Code::kCorrupt);
  EXPECT_NE(not_gguf.status().message().find("not a GGUF file"), std::string::npos) << not_gguf.status().message();
}

// A model larger than the memory available is refused before anything is copied (the copy is
// resident: the OOM killer would end the daemon half-way). The file is a valid GGUF whose one F32
// tensor makes it larger than MemAvailable; it is sparse, so it costs no disk.
TEST(WeightsSegment, RefusesAModelLargerThanTheAvailableMemory) {
  std::ifstream meminfo("/proc/meminfo");
  unsigned long long available_kib = 0;
  for (std::string line; std::getline(meminfo, line);) {
    if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &available_kib) == 1) break;
  }
  if (available_kib == 0) GTEST_SKIP() << "no MemAvailable in /proc/meminfo";
  const uint64_t elements = (available_kib * 1024 + (uint64_t{1} << 30)) / 4;  // 1 GiB more than available
  std::vector<uint8_t> head;
  auto put = [&head](const void* p, size_t n) {
    head.insert(head.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  };
  const uint32_t version = 3, n_dims = 1, type_f32 = 0;
  const uint64_t n_tensors = 1, n_kv = 0, name_len = 1, offset = 0;
  put("GGUF", 4);
  put(&version, 4);
  put(&n_tensors, 8);
  put(&n_kv, 8);
  put(&name_len, 8);
  put("w", 1);
  put(&n_dims, 4);
  put(&elements, 8);
  put(&type_f32, 4);
  put(&offset, 8);
  head.resize((head.size() + 31) / 32 * 32, 0);
  char path[] = "/tmp/inferd-huge-XXXXXX.gguf";
  const int fd = ::mkstemps(path, 5);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, head.data(), head.size()), static_cast<ssize_t>(head.size()));
  if (::ftruncate(fd, static_cast<off_t>(head.size() + elements * 4)) != 0) {
    ::close(fd);
    ::unlink(path);
    GTEST_SKIP() << "/tmp does not take a sparse file of " << (elements * 4 >> 20) << " MiB";
  }
  ::close(fd);
  auto seg = WeightsSegment::create(path, nullptr);
  ::unlink(path);
  ASSERT_FALSE(seg) << "a " << (elements * 4 >> 20) << " MiB model was copied into shared memory";
  EXPECT_EQ(seg.status().code(), Code::kOutOfRange) << seg.status().to_string();
  EXPECT_NE(seg.status().message().find("MemAvailable"), std::string::npos) << seg.status().message();
}

// Writes `bytes` into a memfd, optionally sealed.
UniqueFd memfd_with(const std::vector<uint8_t>& bytes, bool seal) {
  UniqueFd fd(::memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(static_cast<ssize_t>(bytes.size()), ::pwrite(fd.get(), bytes.data(), bytes.size(), 0));
  if (seal) {
    EXPECT_EQ(0, ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW));
  }
  return fd;
}

TEST(WeightsSegment, AttachRejectsUnsealedAndDamagedSegments) {
  auto seg = WeightsSegment::create(kModel, nullptr);
  ASSERT_TRUE(seg) << seg.status().to_string();
  std::vector<uint8_t> bytes(seg.value()->data(), seg.value()->data() + seg.value()->size());

  auto unsealed = WeightsSegment::attach(memfd_with(bytes, false));
  ASSERT_FALSE(unsealed);
  EXPECT_NE(unsealed.status().message().find("not sealed"), std::string::npos);

  struct Damage {
    const char* what;
    size_t offset;
    uint8_t value;
  };
  const WeightsHeader& h = seg.value()->header();
  for (Damage d : {Damage{"bad magic", 0, 'X'}, Damage{"version", 8, 9},
                   Damage{"checksum", static_cast<size_t>(h.table_offset) + 70, 0xFF},
                   Damage{"GGUF", static_cast<size_t>(h.gguf_offset), 'X'},
                   Damage{"data offset", offsetof(WeightsHeader, data_offset) + 1, 0x13}}) {
    std::vector<uint8_t> broken = bytes;
    broken[d.offset] ^= d.value;
    auto r = WeightsSegment::attach(memfd_with(broken, true));
    ASSERT_FALSE(r) << d.what;
    EXPECT_EQ(r.status().code(), Code::kCorrupt) << d.what << ": " << r.status().to_string();
  }
  std::vector<uint8_t> tiny(100, 0);
  EXPECT_FALSE(WeightsSegment::attach(memfd_with(tiny, true)));

  // A table whose checksum holds but whose layouts lie: an unknown layout, and a vector (F32) said to be
  // interleaved.
  const TensorEntry* table = seg.value()->tensors();
  uint32_t vector = h.tensor_count;
  for (uint32_t i = 0; i < h.tensor_count && vector == h.tensor_count; ++i) {
    if (table[i].n_dims == 1) vector = i;
  }
  ASSERT_LT(vector, h.tensor_count);
  for (auto [layout, want] : {std::pair<uint32_t, const char*>{7, "unknown layout"}, {1, "cannot be stored as interleaved16"}}) {
    std::vector<uint8_t> broken = bytes;
    auto* entries = reinterpret_cast<TensorEntry*>(broken.data() + h.table_offset);
    entries[vector].layout = layout;
    reinterpret_cast<WeightsHeader*>(broken.data())->table_checksum =
        fnv1a64(entries, uint64_t{h.tensor_count} * sizeof(TensorEntry));
    auto r = WeightsSegment::attach(memfd_with(broken, true));
    ASSERT_FALSE(r) << want;
    EXPECT_EQ(r.status().code(), Code::kCorrupt);
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().to_string();
  }
}

}  // namespace
}  // namespace inferd::ipc
