#!/usr/bin/env bash
# Installs what kvtier's C++ build needs from Debian's packages (idempotent: installs only what is missing).
set -euo pipefail
pkgs=(build-essential cmake pkg-config liburing-dev libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev
      libssl-dev clang clang-format python3-venv)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
