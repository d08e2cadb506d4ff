#!/usr/bin/env bash
# Sets up, builds and runs every test: the unit and end-to-end tests (ctest), then the corrupt-file
# tests again under AddressSanitizer and UndefinedBehaviorSanitizer (ctest label "sanitize").
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
werror=OFF; [ "${CI:-}" = "true" ] && werror=ON
scripts/build.sh -DINFERD_WERROR=$werror
(cd build && ctest --output-on-failure -j "$(nproc)")

# Sanitized build of the libraries that read untrusted input, running only the sanitize-labelled tests.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DINFERD_SANITIZE=address,undefined \
      -DINFERD_WERROR=$werror >/dev/null
cmake --build build-asan -j "$(nproc)"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -L sanitize)
