#!/usr/bin/env bash
# Makes sure redis-server and redis-cli are on PATH before the tests start their private Redis processes.
# Installs them with apt-get where that is possible (Debian/Ubuntu, as root or with sudo); otherwise says what to install.
set -euo pipefail

# hasp's lock scripts use SET ... GET (Redis 6.2): an older server fails every acquire with a syntax error.
check_version() {
  local v major minor
  v=$(redis-server --version 2>/dev/null | sed -n 's/.* v=\([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1 \2/p')
  # A build that does not say (a fork, say) is given the benefit of the doubt.
  [ -n "$v" ] || return 0
  read -r major minor <<<"$v"
  if [ "$major" -gt 6 ] || { [ "$major" -eq 6 ] && [ "$minor" -ge 2 ]; }; then return 0; fi
  cat >&2 <<MSG
$(command -v redis-server) is Redis $major.$minor; hasp needs Redis 6.2 or later (older distributions, e.g. Ubuntu
22.04 and Debian 11, ship 6.0). Put a newer redis-server and redis-cli first on PATH, for instance from Redis's own
APT repository (https://github.com/redis/redis-debian):
  sudo apt-get install -y lsb-release curl gpg
  curl -fsSL https://packages.redis.io/gpg | sudo gpg --dearmor -o /usr/share/keyrings/redis-archive-keyring.gpg
  echo "deb [signed-by=/usr/share/keyrings/redis-archive-keyring.gpg] https://packages.redis.io/deb \$(lsb_release -cs) main" | sudo tee /etc/apt/sources.list.d/redis.list
  sudo apt-get update && sudo apt-get install -y redis
or on macOS: brew install redis
MSG
  return 1
}

if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
  check_version
  exit $?
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
    [ "$status" -eq 0 ] || exit "$status"
    check_version
    exit $?
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
