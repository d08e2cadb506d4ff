#!/usr/bin/env bash
# Builds llama.cpp's llama-bench for AVX2 + FMA + F16C only (no AVX-512, no VNNI), from the same vendored
# llama.cpp that ../shared/reference/llama-tools.sh builds with -march=native, into
# ${INFERD_REF_DIR:-~/.cache/inferd-ref}/llama-avx2/bin: the reference for the AVX2-only path on a CPU that
# has AVX-512 (the instruction sets many users' CPUs stop at). Run llama-tools.sh first (it fetches and
# unpacks the source). About 4 minutes on 2 cores.
#   tools/reference/llama-bench-avx2.sh && python3 tools/reference/bench_llama_bench.py --model MODEL \
#       --llama-bench ~/.cache/inferd-ref/llama-avx2/bin/llama-bench --variant avx2:INFERD_ISA=avx2
set -eu
R=${INFERD_REF_DIR:-$HOME/.cache/inferd-ref}; V=0.3.36
L=$R/src/llama_cpp_python-$V/vendor/llama.cpp
[ -x $R/llama-avx2/bin/llama-bench ] && { echo "$R/llama-avx2/bin"; exit 0; }
[ -d $L ] || { echo "run ../shared/reference/llama-tools.sh first (it unpacks $L)" >&2; exit 1; }
cmake -S $L -B $R/llama-avx2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
      -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_VBMI=OFF \
      -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF >/dev/null
ninja -C $R/llama-avx2 llama-bench >/dev/null
echo "$R/llama-avx2/bin"
