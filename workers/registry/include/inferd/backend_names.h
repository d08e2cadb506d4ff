// inferd/backend_names.h — the backend names the daemon, its configuration and the workers agree on.
//
// A name is a family, or a family with a device index: "cpu", "opencl", "opencl:1", "cuda:0". Every
// family inferd knows is listed once (workers/CMakeLists.txt, INFERD_BACKEND_FAMILIES), with whether
// it has devices and whether this build has it (a backend folder registers itself with
// inferd_add_backend()); this library is generated from that list and links no backend, so the daemon
// checks names without linking one.
// Thread safety: pure functions over constant tables.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "inferd/status.h"

namespace inferd {

struct BackendName {
  std::string family;  // "cpu", "cuda", "opencl", ...
  std::string device;  // decimal device index; "" = the backend's default device
};

// "family" or "family:N" with N decimal digits; nullopt for anything else, and for a device index on a
// family without devices ("cpu:0"). An unknown family parses (check_backend_name refuses it).
std::optional<BackendName> parse_backend_name(std::string_view name);

struct BackendFamily {
  std::string_view name;
  bool has_devices = false;  // takes ":N"
  bool built = false;        // this build of inferd has it
};
// Every family inferd knows, built or not.
std::span<const BackendFamily> backend_families();
const BackendFamily* find_backend_family(std::string_view family);

// kInvalidArgument for a malformed name or a family inferd does not know (naming the valid forms);
// kUnimplemented for a family this build lacks.
Status check_backend_name(std::string_view name);
// The valid forms, for messages and --help: "cpu, cuda, cuda:N, opencl or opencl:N".
std::string backend_name_forms();

}  // namespace inferd
