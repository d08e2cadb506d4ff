#!/usr/bin/env bash
# Set-up, build, load the default model and generate: the main job of a fresh checkout.
#   scripts/quickstart.sh ["prompt"] [extra inferd-run options]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh >/dev/null
prompt=${1:-"The three most useful things to know about the Linux command line are"}
shift || true
exec build/tools/inferd-run -m models/SmolLM2-135M-Instruct.Q4_1.gguf -p "$prompt" -n 96 --temp 0 "$@"
