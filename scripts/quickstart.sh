#!/usr/bin/env bash
# The main job of a fresh checkout: set up, build, start the daemon, load the default model, generate.
#   scripts/quickstart.sh ["prompt"] [extra `inferctl generate` options]
# The daemon runs on a private socket for the duration of the script and is stopped at the end; to keep
# one running, start build/bin/inferd yourself (see README.md) or install the systemd units.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh >/dev/null

prompt=${1:-"The three most useful things to know about the Linux command line are"}
shift || true
run_dir=$(mktemp -d /tmp/inferd-quickstart.XXXXXX)
export INFERD_SOCKET=$run_dir/inferd.sock
build/bin/inferd --socket "$INFERD_SOCKET" 2>"$run_dir/inferd.log" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null || true; rm -rf "$run_dir"' EXIT

# The daemon is up once `inferctl status` can connect (exit code 3: not yet).
for _ in $(seq 1 200); do
  build/bin/inferctl status >/dev/null 2>&1 && break
  kill -0 $daemon 2>/dev/null || { cat "$run_dir/inferd.log" >&2; exit 1; }
  sleep 0.05
done

build/bin/inferctl load "$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf" --id smollm2
build/bin/inferctl generate -m smollm2 -p "$prompt" -n 96 --temp 0 "$@"
echo
build/bin/inferctl ps
