// The CPU step backend: the engine (workers/engine) behind the StepBackend contract.

#include "inferd/engine.h"
#include "inferd/kernels/cpu.h"
#include "inferd/sampler.h"
#include "engine_backend.h"

namespace inferd::worker {
namespace {

class CpuBackend final : public EngineBackend<Engine> {
 public:
  using EngineBackend::EngineBackend;

  std::string device() const override {
    const EngineOptions& o = engine().options();
    std::string layers = engine().is_first_stage() && engine().is_last_stage()
                             ? ""
                             : ", layers " + std::to_string(o.first_layer) + "-" + std::to_string(o.end_layer - 1);
    return std::string("CPU (") + kernels::isa_name(kernels::best_isa()) + "), " + std::to_string(o.n_threads) +
           " threads" + layers;
  }
  uint64_t kv_bytes() const override { return engine().stats().kv_bytes; }
  uint64_t arena_bytes() const override { return engine().stats().arena_bytes; }
};

}  // namespace

Result<std::unique_ptr<StepBackend>> make_cpu_backend(std::shared_ptr<const Model> model, const BackendOptions& options) {
  EngineOptions eo;
  eo.n_ctx = options.context_size;
  eo.n_slots = options.slots;
  eo.n_threads = options.threads;
  eo.n_ubatch = options.batch_tokens;
  eo.pad_step = options.pad_step;
  eo.first_layer = options.first_layer;
  eo.end_layer = options.end_layer;
  INFERD_RETURN_IF_ERROR(check_engine_backend_options(*model, options));
  auto engine = Engine::create(std::move(model), eo);
  if (!engine) return engine.status();
  return std::unique_ptr<StepBackend>(new CpuBackend(std::move(engine).value(), options));
}

}  // namespace inferd::worker
