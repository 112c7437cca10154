#!/usr/bin/env bash
# Packs the header-only and source dependencies of a galley build into .deps/ (git-ignored), for
# a GPU machine that has a compiler, CMake and the CUDA libraries but cannot install packages:
# Eigen, nlohmann/json, toml++, GoogleTest's sources and zlib's headers. CMake uses .deps/ for whatever
# find_package does not find there (cmake/bundled_deps.cmake). Run it here, then carry .deps.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .deps
mkdir -p .deps/zlib
cp -r /usr/include/eigen3 .deps/eigen3
mkdir -p .deps/json/include && cp -r /usr/include/nlohmann .deps/json/include/
cp -r /usr/src/googletest .deps/googletest
cp /usr/include/zlib.h /usr/include/zconf.h .deps/zlib/
mkdir -p .deps/tomlplusplus/include && cp -r /usr/include/toml++ .deps/tomlplusplus/include/
du -sh .deps
