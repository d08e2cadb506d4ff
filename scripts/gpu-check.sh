#!/usr/bin/env bash
# scripts/gpu-check.sh — every check that needs an NVIDIA GPU, in one run of a few minutes.
#
#   scripts/gpu-check.sh bundle          on the build machine (Debian, no GPU needed): builds what the GPU
#                                        machine runs and packs it into gpu-bundle/ and gpu-bundle.tar.xz
#                                        (binaries, the shared libraries the GPU machine lacks — Cap'n Proto,
#                                        spdlog, fmt, the OpenCL ICD loader — and the Python packages that
#                                        write synthetic models): ~18 MiB compressed
#   scripts/gpu-check.sh untrack         before the checkout travels to a GPU machine whose transfer is
#                                        size-limited (64 MiB): takes the six generated test models out of the
#                                        index (the files stay; `run` writes them again there), so that the
#                                        checkout (~36 MB) and gpu-bundle.tar.xz (~18 MB) fit; `retrack` puts
#                                        them back (do it before the next commit)
#   scripts/gpu-check.sh run [OUTDIR]    on the GPU machine, from the repository root with gpu-bundle/ or
#                                        gpu-bundle.tar.xz in it: writes OUTDIR/summary.txt (default
#                                        gpu-bundle/out) and one log per check
#
# What `run` checks (each step has a time limit; a failed step is reported and the next one runs):
#   1. the backend-ops suite on the CUDA backend, every case, each matmul path;
#   2. the CUDA engine tests (inferd_cuda_test): logits against the CPU engine's (bit for bit with exact
#      numerics; teacher-forced top-1 with float numerics) on the committed synthetic models, SmolLM2
#      (when models/ has it) and the models made here (smollm2-q4_1: the default model's types and
#      shapes), prefill against decode, two slots, a cuda|cpu pipeline, a KV cache too large for the device;
#   3. inferd-cuda-bandwidth (the read bandwidth, the decode GEMV's weight read against it, staged and
#      unstaged, the integer GEMV on 8-bit inputs); inferd-bench --backend cuda on SmolLM2-shaped, 1.1B and
#      8B-shaped Q4_0 models (and 1.1B Q4_K_M and Q8_0) made here by tools/reference/make_synthetic_gguf.py
#      (random codes): float numerics (8-bit inputs and the integer GEMV, split attention), then Q6_K rows on
#      the integer GEMV too (INFERD_CUDA_Q6K_INTEGER=on, off by default; 1.1B Q4_K_M, alternated with off),
#      float inputs, the attention unsplit, exact numerics (the default), tensor cores, no CUDA graphs, no fused GEMVs;
#   4. the daemon: load --backend cuda, 16 concurrent greedy streams against their one-at-a-time outputs,
#      three 256-token generations' speed against inferd-bench in process at the same positions,
#      kill -9 of the CUDA worker mid-stream (the stream completes), status;
#   5. the OpenCL backend on NVIDIA's OpenCL driver: exact numerics against the CPU bit for bit (replayed
#      decode steps included), the split attention, cold and warm load, the decode matmul's shapes;
#   6. exact CUDA numerics through the daemon: greedy outputs of the whole model on CUDA, of a
#      --stage-backends cuda,cpu pipeline and of the CPU alone, compared;
#   7. OpenCL speed (float numerics) on the three Q4_0 shapes with a per-kernel profile, and with replay,
#      the split attention and the prefill's tokens per work-item varied.
# GPU_CHECK_SKIP="backend_ops decode_shapes cuda_speed q8 q6k unsplit opencl opencl_speed opencl_variants daemon
# exact_daemon nograph nofuse exact tensor_cores" leaves those steps out (a rerun after a kernel change); GPU_CHECK_CUDA_FILTER and
# GPU_CHECK_OPENCL_FILTER narrow steps 2 and 5 to a gtest filter.
# The GPU machine has no package registry: nothing is installed there. (GPU_CHECK_PRESETS and
# GPU_CHECK_BACKEND=cpu try the script itself on a machine without a GPU.)
set -uo pipefail
cd "$(dirname "$0")/.."
B=gpu-bundle

bundle() {
  set -e
  local targets=(inferd_backend_ops_test inferd_cuda_test inferd_opencl_test inferd-bench inferd inferd-worker
                 inferctl inferd-run inferd-cuda-bandwidth inferd-opencl-bench inferd-opencl-info)
  if [ ! -f build/build.ninja ]; then scripts/build.sh; fi
  cmake --build build --target "${targets[@]}"
  rm -rf "$B"
  mkdir -p "$B/bin" "$B/lib" "$B/py"
  for t in "${targets[@]}"; do
    local f
    f=$(find build -type f -name "$t" -perm -u+x | head -1)
    [ -n "$f" ] || { echo "missing $t" >&2; exit 1; }
    strip -o "$B/bin/$t" "$f"
  done
  # The shared libraries Ubuntu's CUDA machines lack (glibc and libstdc++ are newer there).
  ldd "$B"/bin/* | awk '/=>/ {print $3}' | sort -u | grep -E 'libinferd|libcapnp|libkj|libspdlog|libfmt|libOpenCL' |
    while read -r so; do cp -L "$so" "$B/lib/"; done
  local site
  site=$(python3 -c 'import gguf, os; print(os.path.dirname(os.path.dirname(gguf.__file__)))')
  cp -r "$site/gguf" "$site/yaml" "$B/py/"
  find "$B/py" -name '__pycache__' -prune -exec rm -rf {} +
  # The tests find their data at the build tree's source path: `run` links it to the checkout there.
  echo "$PWD" > "$B/source_dir"
  tar -cJf "$B.tar.xz" "$B"
  du -sh "$B" "$B.tar.xz"
}

run() {
  if [ ! -d "$B" ] && [ -f "$B.tar.xz" ]; then tar -xJf "$B.tar.xz"; fi
  local out=${1:-$B/out}
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  local summary="$out/summary.txt"
  : > "$summary"
  say() { echo "$*" | tee -a "$summary"; }
  export LD_LIBRARY_PATH="$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PYTHONPATH="$PWD/$B/py"
  # CUDA's exact numerics reproduce the CPU engine's vec_dot matmul order, not the default repacked one: every
  # CPU/CUDA comparison here runs in that order (the OpenCL exact checks follow either).
  export INFERD_MATMUL_ORDER=${INFERD_MATMUL_ORDER:-vec_dot}
  local bin="$PWD/$B/bin" t0=$SECONDS
  local src
  src=$(cat "$B/source_dir")
  if [ "$src" != "$PWD" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
  say "# gpu-check $(date -u +%FT%TZ) on $(hostname)"
  say "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1)"
  say "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"

  # Models, written in the background while the first checks run.
  local models="$PWD/$B/models"
  mkdir -p "$models"
  local model_pids=()
  for preset in ${GPU_CHECK_PRESETS:-smollm2-q4_0 smollm2-q4_1 tinyllama-q4_0 tinyllama-q4_k_m tinyllama-q8_0 8b-q4_0}; do
    INFERD_TOKENIZER_GGUF=tests/data/models/mixed-small.gguf \
      python3 tools/reference/make_synthetic_gguf.py --preset "$preset" --out "$models/$preset.gguf" \
      > "$out/model-$preset.log" 2>&1 &
    model_pids+=($!)
  done

  # The committed test models other than mixed-small stay behind when the checkout travels (its size
  # limit): they are written again here from their presets (the CUDA tests compare the device with the
  # CPU engine on the same file, whatever its bytes).
  local test_pids=()
  for preset in qwen2-small gemma3-small qwen3-small phi3-small llama3-small lowbit-small; do
    [ -f "tests/data/models/$preset.gguf" ] && continue
    INFERD_TOKENIZER_GGUF=tests/data/models/mixed-small.gguf \
      python3 tools/reference/make_synthetic_gguf.py --preset "$preset" --seed 1234 \
      --out "tests/data/models/$preset.gguf" > "$out/model-$preset.log" 2>&1 &
    test_pids+=($!)
  done
  [ ${#test_pids[@]} -eq 0 ] || wait "${test_pids[@]}"
  say "test models: $(cd tests/data/models && ls | tr '\n' ' ')($((SECONDS - t0)) s)"

  skip() { [[ " ${GPU_CHECK_SKIP:-} " == *" $1 "* ]]; }
  local opencl_pid=""
  if ! skip opencl; then
    opencl_checks "$out" "$bin" &
    opencl_pid=$!
  fi

  # 1. Backend ops.
  if ! skip backend_ops; then
    timeout 240 "$bin/inferd_backend_ops_test" --gtest_filter='*cuda*' > "$out/backend_ops.txt" 2>&1
    say "1. backend-ops (cuda): rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$out/backend_ops.txt" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \].*cuda' "$out/backend_ops.txt" | head -20 >> "$summary"
  fi
  wait "${model_pids[@]}"
  for f in "$out"/model-*.log; do tail -1 "$f" | grep -qi error && say "model: $(tail -1 "$f")"; done
  ls -la "$models" >> "$summary"

  # 2. Engine tests (GPU_CHECK_CUDA_FILTER: a gtest filter, e.g. CudaKernels.* for a rerun).
  INFERD_CUDA_TEST_MODELS="$models/smollm2-q4_0.gguf:$models/smollm2-q4_1.gguf:$models/tinyllama-q4_k_m.gguf" \
    timeout 300 "$bin/inferd_cuda_test" --gtest_filter="${GPU_CHECK_CUDA_FILTER:-*}" > "$out/cuda_test.txt" 2>&1
  say "2. inferd_cuda_test ${GPU_CHECK_CUDA_FILTER:-}: rc=$? $(grep -E '^\[  (PASSED|FAILED) +\] [0-9]+ test' "$out/cuda_test.txt" | tr '\n' ' ')"
  grep -E '^\[cuda\]|^\[  FAILED  \]' "$out/cuda_test.txt" | grep -v '^\[cuda\] CUDA:' | sort -u | head -40 >> "$summary"

  # 3. Speed: the device's read bandwidth and the decode GEMV against it, then the models.
  skip cuda_speed || cuda_speed_checks "$out" "$bin" "$models"

  # 4. The daemon.
  skip daemon || daemon_checks "$models/smollm2-q4_0.gguf" "$out" "$bin"

  # 5. OpenCL, started at the beginning (its kernels compile on the host CPU meanwhile).
  if [ -n "$opencl_pid" ]; then
    wait "$opencl_pid"
    say "5. OpenCL on NVIDIA's driver (exact numerics against the CPU): $(cat "$out/opencl-summary.txt")"
    grep -E '^\[  FAILED  \]|differ' "$out/opencl.txt" "$out/opencl_ops.txt" 2>/dev/null | head -20 >> "$summary"
  fi

  # 6. Exact numerics through the daemon.
  skip exact_daemon || exact_daemon_checks "$models/smollm2-q4_1.gguf" "$out" "$bin"

  # 7. OpenCL speed on the issue's shapes, float numerics. First the defaults (the storage and decode shape
  # measured at load in a fresh cache, decode steps replayed, the attention split over positions) with a
  # profile (device time per kernel, the device's idle time, the host's time per launch); then, with the
  # measured storage and shape forced (another configuration would be timed again and might choose
  # otherwise), the fusions off, other attention chunks, and per model the replay and the split attention off
  # (small models) or 8 prefill tokens per work-item (8B).
  if ! skip opencl_speed && [ -f "$out/icd/nvidia.icd" ]; then
    local clcache pinned
    clcache=$(mktemp -d)
    for m in smollm2-q4_0 tinyllama-q4_0 8b-q4_0; do
      XDG_CACHE_HOME="$clcache" OCL_ICD_VENDORS="$out/icd" timeout 120 "$bin/inferd-opencl-bench" "$models/$m.gguf" \
        -p 512 -n 128 -r 3 --float --profile > "$out/opencl-bench-$m.txt" 2>&1
      say "7. OpenCL $m: rc=$? $(grep -E '^(storage|prefill|decode)' "$out/opencl-bench-$m.txt" | tr -s ' ' | tr '\n' ';')"
      grep -A6 -E '^profile' "$out/opencl-bench-$m.txt" | sed 's/^/   /' >> "$summary"
      pinned=$(sed -n 's/^storage: \([a-z0-9_]*\), decode matmul \([0-9]*x[0-9]*\).*/--storage \1 --decode-shape \2/p' \
        "$out/opencl-bench-$m.txt")
      [ -n "$pinned" ] && ! skip opencl_variants || continue
      local variant variants=("--no-fuse" "--attention-chunk 32" "--attention-chunk 128")
      # The 8B shape is device-bound (replay changed nothing there) and only it gained from 8 prefill tokens.
      if [ "$m" = 8b-q4_0 ]; then variants+=("--prefill-tokens 8"); else variants+=("--no-replay" "--attention-chunk 0"); fi
      for variant in "${variants[@]}"; do
        local n=128 tag=${variant// /}
        [[ $variant == --prefill-tokens* ]] && n=4
        # shellcheck disable=SC2086
        XDG_CACHE_HOME="$clcache" OCL_ICD_VENDORS="$out/icd" timeout 90 "$bin/inferd-opencl-bench" "$models/$m.gguf" \
          -p 512 -n $n -r 2 --float $pinned $variant > "$out/opencl-bench-$m$tag.txt" 2>&1
        say "7. OpenCL $m, $variant: rc=$? $(grep -E '^(prefill|decode)' "$out/opencl-bench-$m$tag.txt" | tr -s ' ' | tr '\n' ';')"
      done
    done
  elif ! skip opencl_speed; then
    say "7. OpenCL speed: skipped (no NVIDIA OpenCL library, or the opencl step was skipped)"
  fi
  say "total $((SECONDS - t0)) s"
  # Every log in one archive beside the summary.
  local logs
  logs=$(mktemp)
  (cd "$out" && tar -czf "$logs" --exclude=summary.txt . && find . -mindepth 1 ! -name summary.txt -delete &&
     mv "$logs" logs.tar.gz)
}

# Step 3: the CUDA backend's speed (the device's read bandwidth, the decode GEMV against it, the models).
cuda_speed_checks() {
  local out=$1 bin=$2 models=$3
  timeout 60 "$bin/inferd-cuda-bandwidth" --reps 20 > "$out/bandwidth.txt" 2>&1
  say "3. inferd-cuda-bandwidth: rc=$?"
  sed 's/^/   /' "$out/bandwidth.txt" >> "$summary"
  say "   inferd-bench --backend cuda (pp512, tg128, median of 3): float numerics (8-bit inputs, split attention)"
  for m in smollm2-q4_0 tinyllama-q4_0 tinyllama-q4_k_m tinyllama-q8_0 8b-q4_0; do
    INFERD_CUDA_NUMERICS=float timeout 120 "$bin/inferd-bench" --backend cuda -m "$models/$m.gguf" -p 512 -n 128 -r 3 > "$out/bench-$m.txt" 2>&1
    say "  $m: rc=$? $(grep -E '^(prefill|decode|load)' "$out/bench-$m.txt" | tr -s ' ' | tr '\n' ';')"
  done
  grep -m1 '^backend' "$out/bench-8b-q4_0.txt" >> "$summary"
  # Q6_K rows on the integer GEMV (off by default): the 1.1B Q4_K_M model.
  skip q6k || for r in 1 2; do
    for v in off on; do
      INFERD_CUDA_NUMERICS=float INFERD_CUDA_Q6K_INTEGER=$v timeout 120 "$bin/inferd-bench" --backend cuda \
        -m "$models/tinyllama-q4_k_m.gguf" -p 512 -n 128 -r 2 > "$out/bench-q6k-$v-$r.txt" 2>&1
      say "  tinyllama-q4_k_m, Q6_K integer $v (round $r): rc=$? $(grep -E '^(prefill|decode)' "$out/bench-q6k-$v-$r.txt" | tr -s ' ' | tr '\n' ';')"
    done
  done
  # Each of the defaults turned off in turn: float inputs (the float GEMV), the attention unsplit.
  skip q8 || for m in smollm2-q4_0 tinyllama-q4_0 tinyllama-q8_0 8b-q4_0; do
    INFERD_CUDA_NUMERICS=float INFERD_CUDA_ACTIVATIONS=float timeout 120 "$bin/inferd-bench" --backend cuda \
      -m "$models/$m.gguf" -p 512 -n 128 -r 2 > "$out/bench-f-$m.txt" 2>&1
    say "  $m, float inputs: rc=$? $(grep -E '^(prefill|decode)' "$out/bench-f-$m.txt" | tr -s ' ' | tr '\n' ';')"
  done
  skip unsplit || for m in smollm2-q4_0 tinyllama-q4_0 8b-q4_0; do
    INFERD_CUDA_NUMERICS=float INFERD_CUDA_SPLIT_ATTENTION=off timeout 120 "$bin/inferd-bench" --backend cuda \
      -m "$models/$m.gguf" -p 512 -n 128 -r 2 > "$out/bench-unsplit-$m.txt" 2>&1
    say "  $m, attention unsplit: rc=$? $(grep -E '^(prefill|decode)' "$out/bench-unsplit-$m.txt" | tr -s ' ' | tr '\n' ';')"
  done
  skip nograph || for m in smollm2-q4_0 tinyllama-q4_0 8b-q4_0; do
    INFERD_CUDA_NUMERICS=float INFERD_CUDA_GRAPHS=off timeout 60 "$bin/inferd-bench" --backend cuda -m "$models/$m.gguf" \
      -p 512 -n 128 -r 2 > "$out/bench-nograph-$m.txt" 2>&1
    say "  $m, float, CUDA graphs off: rc=$? $(grep -E '^decode' "$out/bench-nograph-$m.txt" | tr -s ' ' | tr '\n' ';')"
  done
  skip nofuse || for m in smollm2-q4_0 tinyllama-q4_0 8b-q4_0; do
    INFERD_CUDA_NUMERICS=float INFERD_CUDA_FUSE=off timeout 60 "$bin/inferd-bench" --backend cuda -m "$models/$m.gguf" \
      -p 512 -n 128 -r 2 > "$out/bench-nofuse-$m.txt" 2>&1
    say "  $m, float, fused GEMVs off: rc=$? $(grep -E '^decode' "$out/bench-nofuse-$m.txt" | tr -s ' ' | tr '\n' ';')"
  done
  skip exact || for m in smollm2-q4_0 tinyllama-q4_0 8b-q4_0; do
    INFERD_CUDA_NUMERICS=exact timeout 100 "$bin/inferd-bench" --backend cuda -m "$models/$m.gguf" -p 512 -n 128 -r 2 \
      > "$out/bench-exact-$m.txt" 2>&1
    say "  $m, exact numerics: rc=$? $(grep -E '^(prefill|decode)' "$out/bench-exact-$m.txt" | tr -s ' ' | tr '\n' ';')"
  done
  skip tensor_cores || for m in tinyllama-q4_0 8b-q4_0; do
    INFERD_CUDA_MATMUL=tensor_cores timeout 60 "$bin/inferd-bench" --backend cuda -m "$models/$m.gguf" -p 512 -n 32 -r 3 \
      > "$out/bench-tc-$m.txt" 2>&1
    say "  $m, tensor cores: rc=$? $(grep -E '^(prefill|decode)' "$out/bench-tc-$m.txt" | tr -s ' ' | tr '\n' ';')"
  done
}

# The OpenCL backend on NVIDIA's OpenCL library (no ICD file there: one is written for the loader): the
# exact ops and the exact engine against the CPU engine, with FP contraction off.
opencl_checks() {
  local out=$1 bin=$2 lib
  lib=$(ls /usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1 /usr/lib/libnvidia-opencl.so.1 2>/dev/null | head -1)
  if [ -z "$lib" ]; then echo "no libnvidia-opencl.so.1" > "$out/opencl-summary.txt"; return; fi
  mkdir -p "$out/icd"
  echo "$lib" > "$out/icd/nvidia.icd"
  local filter='BackendOps.ExactRowOps:BackendOps.MatmulExactKQuantsEqualTheCpuKernels:BackendOps.RopeKvAndAttentionExact:BackendOps.MatmulExactLowBitTypesEqualTheCpuKernels:BackendOps.MatmulLowBitTypes:BackendOps.RopeKvAndSplitAttention:ClEngineFiles.MixedSmallEqualsTheCpuEngine:ClEngineFiles.NewArchitecturesAndTypesEqualTheCpuEngine:ClEngineFiles.SplitAttentionAgreesWithOneGroupPerHead:ClEngineSyntheticTest.MeasuredStorageIsTheFastestAndIsRecorded:ClEngineSyntheticTest.ReplayedStepsGiveTheNodesBits'
  filter=${GPU_CHECK_OPENCL_FILTER:-$filter}
  OCL_ICD_VENDORS="$out/icd" timeout 170 "$bin/inferd_opencl_test" --gtest_filter="$filter" > "$out/opencl.txt" 2>&1
  local rc=$?
  echo "rc=$rc $(grep -E '^\[  (PASSED|FAILED) +\] [0-9]+ test' "$out/opencl.txt" | tr '\n' ' ')" > "$out/opencl-summary.txt"
  # A cold load (empty program cache: every kernel compiled, a pass's kernels side by side, the activations'
  # storage timed) and a warm one (kernels from the disk cache, the storage from its record). The CUDA
  # checks share the host CPU meanwhile.
  local cache
  cache=$(mktemp -d)
  for run in cold warm; do
    XDG_CACHE_HOME="$cache" OCL_ICD_VENDORS="$out/icd" timeout 120 "$bin/inferd-opencl-bench" \
      tests/data/models/mixed-small.gguf -p 64 -n 16 -r 1 > "$out/opencl-load-$run.txt" 2>&1
    echo "  $run load: $(grep -E '^kernels:' "$out/opencl-load-$run.txt")" >> "$out/opencl-summary.txt"
    echo "  $run $(grep -E '^storage:' "$out/opencl-load-$run.txt")" >> "$out/opencl-summary.txt"
  done
  # The float decode matmul's work-group shapes on an 8B-shaped projection (larger than L2), GB/s each.
  skip decode_shapes && return
  OCL_ICD_VENDORS="$out/icd" timeout 90 "$bin/inferd-opencl-info" --no-timing --decode-shapes --reps 5 \
    > "$out/opencl-decode-shapes.txt" 2>&1
  grep -E '^  decode ' "$out/opencl-decode-shapes.txt" | sed 's/^/ /' >> "$out/opencl-summary.txt"
}

# Daemon checks on `model` with the CUDA backend: 16 concurrent greedy streams equal their one-at-a-time
# outputs; kill -9 of the worker mid-stream: the stream still completes.
daemon_checks() {
  local model=$1 out=$2 bin=$3
  local dir sock
  dir=$(mktemp -d)
  sock="$dir/inferd.sock"
  "$bin/inferd" --socket "$sock" --worker "$bin/inferd-worker" --log-level info > "$out/daemon.log" 2>&1 &
  local dpid=$!
  local ctl=("$bin/inferctl" --socket "$sock")
  for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
  if ! timeout 60 "${ctl[@]}" load "$model" --id m --backend "${GPU_CHECK_BACKEND:-cuda}" --parallel 16 --ctx 1024 > "$out/load.txt" 2>&1; then
    say "4. daemon: load --backend cuda failed: $(tail -2 "$out/load.txt")"
    kill "$dpid"; return
  fi
  "${ctl[@]}" status > "$out/status.txt" 2>&1
  say "4. daemon: $(grep -m1 -i 'cuda' "$out/status.txt" | xargs)"
  local n=48 same=0
  for i in $(seq 0 15); do
    timeout 30 "${ctl[@]}" generate -m m -p "Request $i: the story of" -n $n --temp 0 --ignore-eog -q \
      > "$dir/seq-$i.txt" 2>"$dir/seq-$i.err"
  done
  local par_pids=() par_t0
  par_t0=$(date +%s.%N)
  for i in $(seq 0 15); do
    timeout 60 "${ctl[@]}" generate -m m -p "Request $i: the story of" -n $n --temp 0 --ignore-eog -q \
      > "$dir/par-$i.txt" 2>"$dir/par-$i.err" &
    par_pids+=($!)
  done
  wait "${par_pids[@]}"
  local par_s
  par_s=$(python3 -c "import time; print(f'{time.time() - $par_t0:.2f}')")
  for i in $(seq 0 15); do cmp -s "$dir/seq-$i.txt" "$dir/par-$i.txt" && same=$((same + 1)); done
  say "   16 concurrent greedy streams equal to one at a time: $same/16 (16 x $n tokens in $par_s s, prompts and client start included)"
  # One stream's speed through the daemon (the stats line), then kill -9 mid-stream.
  timeout 60 "${ctl[@]}" generate -m m -p "The long road" -n 256 --temp 0 --ignore-eog > "$dir/ref.txt" 2>"$dir/ref.err"
  say "   one stream through the daemon: $(tail -1 "$dir/ref.err")"
  # Two more of the same (the in-process figure below is a median of 3).
  local again
  for again in 2 3; do
    timeout 60 "${ctl[@]}" generate -m m -p "The long road" -n 256 --temp 0 --ignore-eog > /dev/null 2>"$dir/ref-$again.err"
    say "   again: $(tail -1 "$dir/ref-$again.err")"
  done
  # The same positions in process (a 4-token prompt, then 256 decode steps; the daemon's worker runs the
  # default numerics too): the daemon's ratio to in-process.
  timeout 60 "$bin/inferd-bench" --backend "${GPU_CHECK_BACKEND:-cuda}" -m "$model" -p 4 -n 256 -r 3 --ctx-size 1024 \
    > "$out/bench-inprocess.txt" 2>&1
  say "   the same positions in process: $(grep -E '^decode' "$out/bench-inprocess.txt" | tr -s ' ')"
  local wpid
  wpid=$("${ctl[@]}" --json status | python3 -c '
import json, sys
print(json.load(sys.stdin)["models"][0]["info"]["workers"][0]["pid"])')
  timeout 60 "${ctl[@]}" generate -m m -p "The long road" -n 256 --temp 0 --ignore-eog -q --stream-interval 0 \
    > "$dir/killed.txt" 2>"$dir/killed.err" &
  local gpid=$!
  sleep 0.4
  kill -9 "$wpid" 2>/dev/null
  wait "$gpid"
  local grc=$?
  local verdict="differs"
  cmp -s "$dir/ref.txt" "$dir/killed.txt" && verdict="equal"
  say "   kill -9 of worker $wpid mid-stream: generate rc=$grc, output $verdict to the uninterrupted one ($(wc -c < "$dir/killed.txt") vs $(wc -c < "$dir/ref.txt") bytes)"
  "${ctl[@]}" status > "$out/status-after.txt" 2>&1
  "${ctl[@]}" --json status | python3 -c '
import json, sys
m = json.load(sys.stdin)["models"][0]
print("   after the kill: replays", m["replays"], "restarts", m["info"]["workers"][0]["restarts"],
      "worker", m["info"]["workers"][0]["device"])' >> "$summary"
  kill "$dpid"; wait "$dpid" 2>/dev/null
  rm -rf "$dir"
}

# Exact CUDA numerics through the daemon on `model`: the same greedy outputs from the whole model on
# CUDA, from the first half of its layers on CUDA and the rest on the CPU (--stage-backends cuda,cpu),
# and from the CPU alone.
exact_daemon_checks() {
  local model=$1 out=$2 bin=$3
  local dir sock
  dir=$(mktemp -d)
  sock="$dir/inferd.sock"
  INFERD_CUDA_NUMERICS=exact "$bin/inferd" --socket "$sock" --worker "$bin/inferd-worker" --log-level info \
    > "$out/daemon-exact.log" 2>&1 &
  local dpid=$!
  local ctl=("$bin/inferctl" --socket "$sock")
  for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
  local layers
  layers=$(python3 -c "
import sys; sys.path.insert(0, '$PWD/$B/py')
import gguf
r = gguf.GGUFReader('$model')
for f in r.fields.values():
    if f.name.endswith('.block_count'): print(int(f.parts[-1][0]))")
  local half=$((layers / 2))
  timeout 60 "${ctl[@]}" load "$model" --id x --backend cuda --parallel 4 --ctx 512 > "$out/load-x.txt" 2>&1 || say "6. load x: $(tail -1 "$out/load-x.txt")"
  timeout 60 "${ctl[@]}" load "$model" --id s --layer-split "$half" --stage-backends cuda,cpu --parallel 4 --ctx 512 \
    > "$out/load-s.txt" 2>&1 || say "6. load s (cuda,cpu split at $half): $(tail -1 "$out/load-s.txt")"
  timeout 60 "${ctl[@]}" load "$model" --id c --backend cpu --parallel 4 --ctx 512 > "$out/load-c.txt" 2>&1 || say "6. load c: $(tail -1 "$out/load-c.txt")"
  "${ctl[@]}" status > "$out/status-exact.txt" 2>&1
  local same_x=0 same_s=0 i
  for i in 0 1 2 3 4 5; do
    for m in x s c; do
      timeout 60 "${ctl[@]}" generate -m "$m" -p "Prompt $i: once upon a time" -n 64 --temp 0 --ignore-eog -q \
        > "$dir/$m-$i.txt" 2>"$dir/$m-$i.err"
    done
    cmp -s "$dir/x-$i.txt" "$dir/c-$i.txt" && same_x=$((same_x + 1))
    cmp -s "$dir/s-$i.txt" "$dir/c-$i.txt" && same_s=$((same_s + 1))
  done
  say "6. exact numerics through the daemon, 6 greedy 64-token outputs equal to the CPU's: whole model on CUDA $same_x/6, cuda,cpu split at layer $half $same_s/6"
  grep -iE 'cuda|numerics' "$out/status-exact.txt" | head -4 | sed 's/^/   /' >> "$summary"
  cat "$dir"/*.err | sort -u | head -5 >> "$summary"
  kill "$dpid"; wait "$dpid" 2>/dev/null
  rm -rf "$dir"
}

# The committed test models `run` can write again from their presets (all but mixed-small, the tokenizer
# source of every preset).
generated_test_models() {
  local p
  for p in qwen2 gemma3 qwen3 phi3 llama3 lowbit; do echo "tests/data/models/$p-small.gguf"; done
}

case "${1:-}" in
  bundle) bundle ;;
  untrack)
    mkdir -p "$(git rev-parse --git-dir)/info"
    for f in $(generated_test_models); do
      grep -qxF "/$f" "$(git rev-parse --git-dir)/info/exclude" 2>/dev/null || echo "/$f" >> "$(git rev-parse --git-dir)/info/exclude"
    done
    # shellcheck disable=SC2046
    git rm -q --cached $(generated_test_models)
    echo "untracked: $(generated_test_models | tr '\n' ' ')(scripts/gpu-check.sh retrack puts them back)" ;;
  retrack)
    # shellcheck disable=SC2046
    git reset -q HEAD -- $(generated_test_models)
    exclude="$(git rev-parse --git-dir)/info/exclude"
    if [ -f "$exclude" ]; then
      tmp=$(mktemp)
      grep -vxF -f <(generated_test_models | sed 's|^|/|') "$exclude" > "$tmp" || true
      mv "$tmp" "$exclude"
    fi
    git status --short -- tests/data/models ;;
  run) shift; run "$@" ;;
  *) sed -n '2,36p' "$0"; exit 2 ;;
esac
