#!/usr/bin/env bash
# Runs the whole test suite against Valkey instead of Redis: the harness starts `redis-server` and `redis-cli` from
# PATH, so this puts valkey-server and valkey-cli first on PATH under those names, for this run only.
set -euo pipefail

if ! command -v valkey-server >/dev/null 2>&1 || ! command -v valkey-cli >/dev/null 2>&1; then
  cat >&2 <<'MSG'
valkey-server and valkey-cli are needed on PATH. Install them:
  Debian 13, Ubuntu 24.10 and later: sudo apt-get install -y valkey-server valkey-tools
  Debian 12: enable bookworm-backports, then sudo apt-get install -y -t bookworm-backports valkey-server valkey-tools
  macOS: brew install valkey
MSG
  exit 1
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/hasp-valkey.XXXXXX")
trap 'rm -rf "$dir"' EXIT
ln -s "$(command -v valkey-server)" "$dir/redis-server"
ln -s "$(command -v valkey-cli)" "$dir/redis-cli"
valkey-server --version
pnpm build
PATH="$dir:$PATH" pnpm exec vitest run "$@"
