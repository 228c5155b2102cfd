#!/usr/bin/env bash
# Installs the Debian packages megatrain builds with, when any is missing (run as root on Debian 12+), and,
# where a CUDA toolkit is present, the cuDNN frontend headers for the fused attention (.deps/, from PyPI).
set -euo pipefail
pkgs=(build-essential cmake ninja-build ccache python3 python3-pip python3-venv libyaml-cpp-dev libcli11-dev libspdlog-dev libfmt-dev
      libopenblas-dev libgloo-dev libgtest-dev pkg-config libpcre2-dev libicu-dev nlohmann-json3-dev libsentencepiece-dev clang-format xz-utils)
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

# The cuDNN frontend headers (header-only; cuDNN itself comes with the toolkit). Without them the CUDA build
# still builds, with the megatrain attention kernel only, so a failed download is a warning.
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  "$(dirname "$0")/fetch-cudnn-frontend.sh" ||
    echo "install-deps: warning: no cuDNN frontend headers: the CUDA build will use the megatrain attention kernel" >&2
fi
