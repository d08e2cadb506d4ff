// daemon/kj_bridge.h — from the KJ event loop (the RPC and HTTP servers) to the supervisor's thread and
// back: a function posted to the supervisor, its answer fulfilling a promise on the loop's thread.
// Thread safety: call on the KJ loop's thread; `fn` runs on the supervisor's; `reply` may be called
// from any thread (the supervisor hands text work to its text pool).
#pragma once

#include <kj/async.h>
#include <kj/time.h>

#include <memory>

#include "supervisor.h"

namespace inferd::daemon {

// stream-stall-timeout as KJ's timers take it.
inline kj::Duration stream_stall_timeout(const DaemonConfig& config) {
  return static_cast<int64_t>(config.stream_stall_timeout_s * 1000) * kj::MILLISECONDS;
}

// Runs fn(reply) on the supervisor thread; whatever thread calls reply(value) fulfils the returned
// promise on this thread.
template <typename T, typename Fn>
kj::Promise<T> on_supervisor_async(Supervisor& sup, Fn fn) {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<T>();
  auto holder = std::make_shared<kj::Own<kj::CrossThreadPromiseFulfiller<T>>>(kj::mv(paf.fulfiller));
  sup.post([holder, fn]() mutable { fn([holder](T value) { (*holder)->fulfill(kj::mv(value)); }); });
  return kj::mv(paf.promise);
}

// Runs fn() on the supervisor thread; its result fulfils the returned promise on this thread.
template <typename T, typename Fn>
kj::Promise<T> on_supervisor(Supervisor& sup, Fn fn) {
  return on_supervisor_async<T>(sup, [fn](auto reply) mutable { reply(fn()); });
}

// Hands a generation to the supervisor; `then` continues with whether it was accepted (Status).
// Dropping the returned promise (the client went away, the server stops) cancels the generation at
// its next step. The one way both front ends start generations.
template <typename Then>
auto start_generation(Supervisor& sup, GenerateParams params, std::shared_ptr<GenerationStream> stream, Then&& then) {
  const std::string model = params.model;
  auto submitted = on_supervisor_async<Status>(sup, [&sup, params = std::move(params), stream](auto reply) mutable {
    sup.generate(std::move(params), stream, std::move(reply));
  });
  auto cancel = kj::defer([&sup, stream, model] {
    stream->cancel();
    sup.post([&sup, model] { sup.kick(model); });
  });
  return submitted.then(std::forward<Then>(then)).attach(kj::mv(cancel));
}

}  // namespace inferd::daemon
