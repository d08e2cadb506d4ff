#!/usr/bin/env bash
# Sets up, builds and runs every test: the unit and end-to-end tests (ctest), then the corrupt-file
# tests again under AddressSanitizer and UndefinedBehaviorSanitizer (ctest label "sanitize").
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
werror=OFF; [ "${CI:-}" = "true" ] && werror=ON
scripts/build.sh -DINFERD_WERROR=$werror
(cd build && ctest --output-on-failure -j "$(nproc)")

# Sanitized build (ASan + UBSan) of the libraries that read untrusted input: the GGUF reader (and its
# corrupt-file set), the tokenizer and the sampling parameter checks.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DINFERD_SANITIZE=address,undefined \
      -DINFERD_WERROR=$werror >/dev/null
# Only the binaries of sanitize-labelled tests are built here.
cmake --build build-asan -j "$(nproc)" --target inferd_gguf_test inferd_gguf_corrupt_test inferd_tokenizer_test \
      inferd_sampling_test
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -L sanitize)
