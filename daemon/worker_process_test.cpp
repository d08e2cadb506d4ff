// The supervisor's decoding of a worker's control frames (worker_process.h), without a process.
#include "worker_process.h"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include "inferd/ipc/frame.h"
#include "inferd/schemas/worker.capnp.h"

namespace inferd::daemon {
namespace {

std::vector<uint8_t> payload(capnp::MessageBuilder& m) {
  std::vector<uint8_t> frame = ipc::encode_frame(m);
  return std::vector<uint8_t>(frame.begin() + 4, frame.end());
}

TEST(WorkerMessages, DecodeEachMessageAndCutLongStrings) {
  capnp::MallocMessageBuilder ready;
  auto r = ready.initRoot<wire::FromWorker>().initReady();
  const std::string long_device(100000, 'd');
  r.setDevice(long_device);
  r.setKvBytes(123);
  r.setStartMs(1.5);
  std::vector<uint8_t> bytes = payload(ready);
  // Decoded from an odd address too: the frame is copied before it is read.
  std::vector<uint8_t> shifted(bytes.size() + 1);
  std::copy(bytes.begin(), bytes.end(), shifted.begin() + 1);
  auto m = decode_worker_message(std::span<const uint8_t>(shifted.data() + 1, bytes.size()));
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->kind, WorkerMessage::Kind::kReady);
  EXPECT_EQ(m->ready.kv_bytes, 123u);
  EXPECT_EQ(m->ready.device, long_device.substr(0, kMaxWorkerText));

  capnp::MallocMessageBuilder hello;
  hello.initRoot<wire::FromWorker>().initHello().setProtocolVersion(77);
  auto h = decode_worker_message(payload(hello));
  ASSERT_TRUE(h.is_ok());
  EXPECT_EQ(h->kind, WorkerMessage::Kind::kHello);
  EXPECT_EQ(h->protocol_version, 77u);
}

TEST(WorkerMessages, GarbageIsAnErrorNeverACrash) {
  EXPECT_EQ(decode_worker_message({}).status().code(), Code::kCorrupt);
  const std::vector<uint8_t> odd(7, 0);
  EXPECT_EQ(decode_worker_message(odd).status().code(), Code::kCorrupt);
  // A segment table that promises more than the frame holds.
  std::vector<uint8_t> lies = {0, 0, 0, 0, 0xff, 0xff, 0, 0};
  auto m = decode_worker_message(lies);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("malformed"), std::string::npos) << m.status().to_string();
  // A pointer far out of the segment.
  std::vector<uint8_t> wild = {0, 0, 0, 0, 1, 0, 0, 0, 0xfc, 0xff, 0xff, 0x7f, 0, 0, 1, 0};
  EXPECT_FALSE(decode_worker_message(wild).is_ok());
}

}  // namespace
}  // namespace inferd::daemon
