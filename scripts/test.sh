#!/usr/bin/env bash
# Sets up, builds and runs every test: the unit and end-to-end tests (ctest), then the corrupt-file
# tests again under AddressSanitizer and UndefinedBehaviorSanitizer (ctest label "sanitize").
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
werror=OFF; [ "${CI:-}" = "true" ] && werror=ON
scripts/build.sh -DINFERD_WERROR=$werror
# ctest -j starts the longest tests first when it knows their times (build/Testing/Temporary/CTestCostData.txt,
# which each run updates). A fresh build starts from tests/ctest_costs.txt, the tests of 1.5 s or more in a
# run on 2 cores (regenerate it from a run's CTestCostData.txt: the lines above "---" with a last field
# >= 1.5): the one-at-a-time end-to-end tests then run beside the unit tests instead of as an idle tail.
mkdir -p build/Testing/Temporary
[ -f build/Testing/Temporary/CTestCostData.txt ] || cp tests/ctest_costs.txt build/Testing/Temporary/CTestCostData.txt
(cd build && ctest --output-on-failure -j "$(nproc)")

# Sanitized build (ASan + UBSan) of the code that reads untrusted input: the GGUF reader (and its
# corrupt-file set), the tokenizer, the sampling parameter checks, the shared-memory formats (weights
# segment, rings), the daemon's configuration parser and scheduler, stop strings, chat templates, the
# model graph and placement plans, and backend names.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DINFERD_SANITIZE=address,undefined \
      -DINFERD_WERROR=$werror >/dev/null
# Only the binaries of sanitize-labelled tests, and the daemon, are built here.
cmake --build build-asan -j "$(nproc)" --target inferd_gguf_test inferd_gguf_corrupt_test inferd_tokenizer_test \
      inferd_sampling_test inferd_ipc_test inferd_daemon_support_test inferd_supervisor_test \
      inferd_client_test inferd_step_logic_test inferd_kernels_cpu_test inferd_kernels_gemm_test \
      inferd_graph_test inferd_backend_names_test \
      inferd inferd-worker inferd-run
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -L sanitize)

# The daemon and its workers, built with the sanitizers, under every kind of bad input a client can send
# (bad files, bad values, garbage on the socket, disconnects): no report, no leak (LeakSanitizer makes
# the daemon's exit status non-zero, which the test checks), and the daemon keeps serving.
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  python3 tests/e2e/test_bad_input.py --bin-dir build-asan/bin --model "$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf" \
  --inferd-run build-asan/tools/inferd-run

# The libFuzzer targets (tests/fuzz: GGUF reader, tokenizers, the step ring read from a hostile worker),
# built with clang, ASan and UBSan, one minute each from their seeds; a finding fails the run.
scripts/fuzz.sh 60
