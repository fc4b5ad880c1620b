#!/usr/bin/env bash
# Makes sure redis-server and redis-cli are on PATH before the tests start their private Redis processes.
# Installs them with apt-get where that is possible (Debian/Ubuntu, as root or with sudo); otherwise says what to install.
set -euo pipefail

if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
  exit 0
fi

if command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else SUDO=""; fi
  fi
  if [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; then
    echo "redis-server not found: installing it with apt-get (Debian package redis-server)..." >&2
    # Keep the package from starting a system service: the tests only use private servers on free ports.
    policy=/usr/sbin/policy-rc.d created=""
    if [ ! -e "$policy" ]; then
      $SUDO sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy" && created=1
    fi
    status=0
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null; } || status=$?
    if [ -n "$created" ]; then $SUDO rm -f "$policy"; fi
    exit "$status"
  fi
fi

cat >&2 <<'MSG'
redis-server not found, and it could not be installed automatically.
The tests start their own private redis-server processes, so they need the binaries on PATH:
  Debian/Ubuntu:  sudo apt-get install -y redis-server
  Fedora/RHEL:    sudo dnf install -y redis
  macOS:          brew install redis
  other:          build Redis 6.2+ from source and put redis-server and redis-cli on PATH
MSG
exit 1
