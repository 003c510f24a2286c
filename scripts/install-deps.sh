#!/usr/bin/env bash
# Installs the Debian 12 packages Megascope builds and tests with. Run as root
# (or with sudo available). The CUDA toolkit is optional and not installed
# here: when nvcc is present (e.g. /usr/local/cuda) the CUDA parts build too.
set -euo pipefail
packages=(
  cmake ninja-build g++ pkg-config clang libclang-rt-14-dev
  libexpected-dev libtomlplusplus-dev nlohmann-json3-dev libcli11-dev libfmt-dev
  catch2 libbenchmark-dev libeigen3-dev libboost-graph-dev
  libopenmpi-dev openmpi-bin
  qt6-base-dev qt6-charts-dev qt6-svg-dev libqt6opengl6-dev libgl-dev fonts-dejavu-core
)
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
