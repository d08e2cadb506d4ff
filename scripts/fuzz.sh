#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS] — builds the libFuzzer targets (tests/fuzz) with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer into build-fuzz/, and runs each for SECONDS (default 60) from its seeds, as
# many at once as there are cores:
#   inferd_fuzz_gguf       the GGUF reader and model loader; seeds: tests/data/corrupt, tests/data/tokenizer
#   inferd_fuzz_tokenizer  SmolLM2's BPE and a SentencePiece vocabulary; seeds: tests/fuzz/corpus/tokenizer
#   inferd_fuzz_ring       the step ring as the supervisor reads it from a hostile worker; seeds: tests/fuzz/corpus/ring
#   inferd_fuzz_control    the control frames a worker sends, as the supervisor decodes them;
#                          seeds: tests/fuzz/corpus/control (one of each message)
#   inferd_fuzz_requests   OpenAI JSON bodies, chat templates, stop strings; seeds: tests/fuzz/corpus/requests
#   inferd_fuzz_rpc        the RPC and HTTP servers fed raw bytes through their sockets, a supervisor behind;
#                          seeds: tests/fuzz/corpus/rpc (recorded client sessions, HTTP requests)
# New inputs go to build-fuzz/corpus/<target> (kept between runs, so longer runs build on shorter ones).
# A crash, a leak or a sanitizer report fails the script and leaves the reproducer in build-fuzz/.
# Prints each target's executions ("Done N runs in S second(s)").
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DINFERD_FUZZ=ON \
  -DINFERD_SANITIZE=address,undefined -DINFERD_CUDA=OFF -DINFERD_OPENCL=OFF -DINFERD_BUILD_TESTS=OFF >/dev/null
cmake --build build-fuzz --target inferd_fuzz_gguf inferd_fuzz_tokenizer inferd_fuzz_ring inferd_fuzz_control \
  inferd_fuzz_requests inferd_fuzz_rpc >/dev/null

# One target: runs it, prints its "Done" line or, on a finding, the report and the reproducer's name.
run() {
  local target=$1
  shift
  mkdir -p "build-fuzz/corpus/$target"
  local log="build-fuzz/$target.log"
  if ! (cd build-fuzz && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        "./tests/fuzz/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1 "corpus/$target" "$@" > "$target.log" 2>&1); then
    grep -a -E "ERROR|SUMMARY|Test unit written" "$log" || tail -20 "$log"
    echo "fuzz: $target FAILED (log: $log)" >&2
    return 1
  fi
  echo "fuzz: $target: $(grep -a -E "^Done" "$log")"
}

# Each target is one process on one core: as many run at once as there are cores.
slots=$(nproc)
failed=0
pids=()
start() {
  echo "fuzz: $1 for ${seconds} s"
  run "$@" &
  pids+=($!)
  if [ "${#pids[@]}" -ge "$slots" ]; then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
}
start inferd_fuzz_gguf "$PWD/tests/data/corrupt" "$PWD/tests/data/tokenizer"
start inferd_fuzz_tokenizer "$PWD/tests/fuzz/corpus/tokenizer"
start inferd_fuzz_ring "$PWD/tests/fuzz/corpus/ring"
start inferd_fuzz_control "$PWD/tests/fuzz/corpus/control"
start inferd_fuzz_requests "$PWD/tests/fuzz/corpus/requests"
start inferd_fuzz_rpc "$PWD/tests/fuzz/corpus/rpc"
for p in "${pids[@]}"; do wait "$p" || failed=1; done
exit $failed
