// inferd/backend_registry.h — the compute backends built into this program, in one place.
//
// Each backend folder registers itself in its CMakeLists.txt:
//   inferd_add_backend(NAME opencl TARGET inferd_backend_opencl FACTORY opencl_backend_factory)
// and defines `const inferd::BackendFactory& inferd::opencl_backend_factory()`. This library is
// generated from those registrations (backend_registry.cpp.in) and links every registered backend; the
// worker, the in-process tools and the backend-ops test find backends here, never by #ifdef.
// Thread safety: the registry is constant; factories may be called from any thread.
#pragma once

#include <memory>
#include <span>
#include <string_view>

#include "inferd/backend.h"
#include "inferd/backend_factory.h"
#include "inferd/status.h"

namespace inferd {

// Every backend built into this program, and one by family (nullptr when not built).
std::span<const BackendFactory* const> registered_backends();
const BackendFactory* find_backend(std::string_view family);

// The factory's environment settings read into `config.settings` (where not already set), then the
// backend created: what the worker does.
Result<std::unique_ptr<Backend>> create_backend(const BackendFactory& factory, BackendConfig config);

}  // namespace inferd
