#include "inferd/ipc/ring.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

namespace inferd::ipc {
namespace {

TEST(Ring, CreateAndAttachAgree) {
  auto ring = RingSegment::create(4, 2);
  ASSERT_TRUE(ring) << ring.status().to_string();
  auto other = RingSegment::attach(UniqueFd(::dup(ring.value()->fd())));
  ASSERT_TRUE(other) << other.status().to_string();
  EXPECT_EQ(other.value()->header().sub_capacity, 4u);
  EXPECT_EQ(other.value()->header().comp_capacity, 2u);
  EXPECT_EQ(other.value()->next_submission(), nullptr);
  EXPECT_EQ(other.value()->next_completion(), nullptr);
}

TEST(Ring, FullAndEmpty) {
  auto ring = std::move(RingSegment::create(2, 2)).value();
  ASSERT_NE(ring->submission_slot(), nullptr);
  ring->submission_slot()->id = 1;
  ring->publish_submission();
  ring->submission_slot()->id = 2;
  ring->publish_submission();
  EXPECT_EQ(ring->submission_slot(), nullptr);  // full
  ASSERT_NE(ring->next_submission(), nullptr);
  EXPECT_EQ(ring->next_submission()->id, 1u);
  ring->release_submission();
  EXPECT_NE(ring->submission_slot(), nullptr);
  EXPECT_EQ(ring->next_submission()->id, 2u);
  ring->release_submission();
  EXPECT_EQ(ring->next_submission(), nullptr);  // empty
}

TEST(Ring, AttachRejectsForeignMemory) {
  auto ring = std::move(RingSegment::create()).value();
  ring->header().version = 99;
  auto r = RingSegment::attach(UniqueFd(::dup(ring->fd())));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
}

// A hostile worker: it rewrites the header's geometry, lies with its counters and changes a completion
// after the supervisor has read it. The supervisor keeps its own geometry and counters (no access outside
// the segment), works on a private copy of each completion, and sees the ring as broken.
TEST(Ring, AHostilePeerCannotMakeTheOtherSideReadOutOfBoundsOrChangeWhatItRead) {
  auto sup = std::move(RingSegment::create(2, 2)).value();
  auto worker = std::move(RingSegment::attach(UniqueFd(::dup(sup->fd())))).value();
  // A completion, read by the supervisor; the worker then scribbles over the shared entry.
  Completion* c = worker->completion_slot();
  ASSERT_NE(c, nullptr);
  c->id = 7;
  c->n_outputs = 1;
  worker->publish_completion();
  const Completion* got = sup->next_completion();
  ASSERT_NE(got, nullptr);
  c->n_outputs = 1000000;  // after the supervisor's read: too late
  c->id = 99;
  EXPECT_EQ(got->n_outputs, 1u);
  EXPECT_EQ(got->id, 7u);
  sup->release_completion();
  // The worker rewrites the geometry: the supervisor does not read it back.
  RingHeader& h = worker->header();
  h.comp_capacity = 1u << 30;
  h.comp_offset = uint64_t{1} << 40;
  h.sub_capacity = 1;
  EXPECT_EQ(sup->next_completion(), nullptr);  // empty, read through its own geometry
  EXPECT_NE(sup->submission_slot(), nullptr);
  EXPECT_FALSE(sup->broken());
  // A completion counter far ahead of anything published: broken, and nothing is read.
  h.comp_head.store(1000, std::memory_order_release);
  EXPECT_EQ(sup->next_completion(), nullptr);
  EXPECT_TRUE(sup->broken());
}

TEST(Ring, ASubmissionTailFromTheFutureBreaksTheRing) {
  auto sup = std::move(RingSegment::create(2, 2)).value();
  sup->header().sub_tail.store(5, std::memory_order_release);  // the worker "consumed" what was never sent
  EXPECT_EQ(sup->submission_slot(), nullptr);
  EXPECT_TRUE(sup->broken());
  // Reading completions checks it too, so the lie is caught at the next wake-up even when no submission
  // follows (a worker that lies and then stops).
  auto again = std::move(RingSegment::create(2, 2)).value();
  again->header().sub_tail.store(5, std::memory_order_release);
  EXPECT_EQ(again->next_completion(), nullptr);
  EXPECT_TRUE(again->broken());
}

// A completion's embedding floats are copied only as far as the array goes, whatever count it claims.
TEST(Ring, AnEmbeddingCountPastTheArrayIsCutAtIt) {
  auto sup = std::move(RingSegment::create(2, 2)).value();
  auto worker = std::move(RingSegment::attach(UniqueFd(::dup(sup->fd())))).value();
  Completion* c = worker->completion_slot();
  ASSERT_NE(c, nullptr);
  c->id = 0;
  c->n_outputs = 0;
  c->n_embd_floats = 0xffffffffu;
  c->embd[kMaxEmbdFloats - 1] = 2.5f;
  worker->publish_completion();
  const Completion* got = sup->next_completion();
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->n_embd_floats, kMaxEmbdFloats);
  EXPECT_EQ(got->embd[kMaxEmbdFloats - 1], 2.5f);
}

TEST(Ring, TheSegmentCannotBeResized) {
  auto sup = std::move(RingSegment::create(2, 2)).value();
  EXPECT_NE(::ftruncate(sup->fd(), 4096), 0);  // a worker cannot shrink it under the supervisor
  EXPECT_EQ(errno, EPERM);
}

// One thread produces submissions through one mapping, another consumes them through a second mapping
// of the same memfd and answers with completions: every id arrives once, in order, with its payload.
TEST(Ring, TwoMappingsTwoThreadsInOrder) {
  auto producer = std::move(RingSegment::create(3, 3)).value();
  auto consumer = std::move(RingSegment::attach(UniqueFd(::dup(producer->fd())))).value();
  constexpr uint64_t kSteps = 20000;
  std::thread worker([&] {
    uint64_t expect = 0;
    while (expect < kSteps) {
      const Submission* s = consumer->next_submission();
      if (!s) continue;  // spin: the test has no wake-up channel
      ASSERT_EQ(s->id, expect);
      ASSERT_EQ(s->n_tokens, 1u);
      ASSERT_EQ(s->tokens[0].token, static_cast<int32_t>(expect * 7));
      Completion* c;
      while (!(c = consumer->completion_slot())) {
      }
      c->id = s->id;
      c->n_outputs = 1;
      c->outputs[0].token = s->tokens[0].token + 1;
      consumer->release_submission();
      consumer->publish_completion();
      ++expect;
    }
  });
  uint64_t sent = 0, received = 0;
  while (received < kSteps) {
    if (sent < kSteps) {
      if (Submission* s = producer->submission_slot()) {
        s->id = sent;
        s->n_tokens = 1;
        s->tokens[0].token = static_cast<int32_t>(sent * 7);
        producer->publish_submission();
        ++sent;
      }
    }
    if (const Completion* c = producer->next_completion()) {
      ASSERT_EQ(c->id, received);
      ASSERT_EQ(c->outputs[0].token, static_cast<int32_t>(received * 7 + 1));
      producer->release_completion();
      ++received;
    }
  }
  worker.join();
}

// The same across a real process boundary.
TEST(Ring, AcrossProcesses) {
  auto ring = std::move(RingSegment::create(4, 4)).value();
  constexpr uint64_t kSteps = 2000;
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto child = RingSegment::attach(UniqueFd(::dup(ring->fd())));
    if (!child) ::_exit(2);
    for (uint64_t i = 0; i < kSteps;) {
      const Submission* s = child.value()->next_submission();
      if (!s) continue;
      if (s->id != i) ::_exit(3);
      Completion* c;
      while (!(c = child.value()->completion_slot())) {
      }
      c->id = s->id * 2;
      child.value()->release_submission();
      child.value()->publish_completion();
      ++i;
    }
    ::_exit(0);
  }
  uint64_t sent = 0, received = 0;
  while (received < kSteps) {
    if (sent < kSteps) {
      if (Submission* s = ring->submission_slot()) {
        s->id = sent++;
        ring->publish_submission();
      }
    }
    if (const Completion* c = ring->next_completion()) {
      ASSERT_EQ(c->id, received * 2);
      ring->release_completion();
      ++received;
    }
  }
  int status = 0;
  ASSERT_EQ(pid, ::waitpid(pid, &status, 0));
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace inferd::ipc

#include "inferd/ipc/hidden_exchange.h"

namespace inferd::ipc {
namespace {

TEST(HiddenExchange, PublishThenReadThroughAnotherMapping) {
  auto writer = std::move(HiddenExchange::create(8, 4)).value();
  auto reader = HiddenExchange::attach(UniqueFd(::dup(writer->fd())), 8, 4);
  ASSERT_TRUE(reader) << reader.status().to_string();
  std::vector<float> rows(3 * 8);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i) * 0.5f;
  EXPECT_FALSE(reader.value()->read(7, 3));  // nothing published yet
  writer->publish(7, rows.data(), 3);
  auto got = reader.value()->read(7, 3);
  ASSERT_TRUE(got) << got.status().to_string();
  EXPECT_TRUE(std::equal(rows.begin(), rows.end(), got.value()));
  EXPECT_FALSE(reader.value()->read(8, 3));  // another step
  EXPECT_FALSE(reader.value()->read(7, 2));  // another size
}

TEST(HiddenExchange, AttachChecksTheShape) {
  auto x = std::move(HiddenExchange::create(8, 4)).value();
  EXPECT_FALSE(HiddenExchange::attach(UniqueFd(::dup(x->fd())), 16, 4));
  EXPECT_FALSE(HiddenExchange::attach(UniqueFd(::dup(x->fd())), 8, 5));
  EXPECT_TRUE(HiddenExchange::attach(UniqueFd(::dup(x->fd())), 8, 4));
}

}  // namespace
}  // namespace inferd::ipc
