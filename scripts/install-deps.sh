#!/usr/bin/env bash
# Installs the Debian packages megatrain builds with, when any is missing (run as root on Debian 12+).
set -euo pipefail
pkgs=(build-essential cmake ninja-build ccache python3 libyaml-cpp-dev libcli11-dev libspdlog-dev libfmt-dev
      libopenblas-dev libgloo-dev libgtest-dev pkg-config libpcre2-dev nlohmann-json3-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
