// inferd/ipc/backend_name.h — the backend names the supervisor and its workers agree on: "cpu",
// "cuda", "opencl", or a GPU backend with a device index, "opencl:1". The one parser of that syntax
// (the daemon's configuration, the supervisor's load check and the worker all use it).
// Thread safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace inferd::ipc {

struct BackendName {
  std::string family;  // "cpu", "cuda", "opencl", ... (not checked against a list here)
  std::string device;  // decimal device index; "" = the backend's default device
};

// "family" or "family:N" with N decimal digits; nullopt for anything else, and for "cpu:N" (the CPU
// backend has no devices).
inline std::optional<BackendName> parse_backend_name(std::string_view name) {
  const size_t colon = name.find(':');
  BackendName b{std::string(name.substr(0, colon)), ""};
  if (b.family.empty()) return std::nullopt;
  if (colon == std::string_view::npos) return b;
  b.device = std::string(name.substr(colon + 1));
  if (b.family == "cpu" || b.device.empty() || b.device.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return b;
}

}  // namespace inferd::ipc
