#!/usr/bin/env bash
# Installs what galley builds and tests with, from Debian's packages (run as root).
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps.sh: run as root (it calls apt-get)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
packages=(cmake make g++ ccache libeigen3-dev libgtest-dev libbenchmark-dev zlib1g-dev
          nlohmann-json3-dev libopenmpi-dev openmpi-bin libtomlplusplus-dev clang libclang-rt-dev libomp-dev python3-torch dataset-fashion-mnist)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
