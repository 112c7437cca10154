#!/usr/bin/env bash
# Packs what a bare GPU machine lacks for scripts/gpu-check.sh into .deps/ (git-ignored), from
# this machine's packages: Eigen's headers, nlohmann/json, toml++, GoogleTest's sources, zlib's
# headers and, when they fit, the four Fashion-MNIST .gz files. The GPU machine needs a compiler,
# CMake, the CUDA toolkit, cuDNN and NCCL of its own; everything else comes from here.
# cmake/bundled_deps.cmake reads .deps (with -DGALLEY_DEPS_ONLY=ON it reads nothing else).
#
# Usage: scripts/pack-gpu-deps.sh [--no-data]
#   GALLEY_FASHION_MNIST_DIR  where the Fashion-MNIST files are (default: Debian's place)
#   GALLEY_CARRY_LIMIT_MB     what may travel in all, the tree and .deps (default: 64)
# Debian packages it reads: libeigen3-dev nlohmann-json3-dev libtomlplusplus-dev libgtest-dev
# zlib1g-dev dataset-fashion-mnist (scripts/install-deps.sh installs them all).
set -euo pipefail
cd "$(dirname "$0")/.."
data=1
[ "${1:-}" = --no-data ] && data=0
fashion="${GALLEY_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}"
limit_mb="${GALLEY_CARRY_LIMIT_MB:-64}"

need() {  # need PATH PACKAGE
  if [ ! -e "$1" ]; then
    echo "pack-gpu-deps: $1 is missing (Debian package $2)" >&2
    exit 1
  fi
}
need /usr/include/eigen3/Eigen/Core libeigen3-dev
need /usr/include/nlohmann/json.hpp nlohmann-json3-dev
need /usr/include/toml++/toml.h libtomlplusplus-dev
need /usr/src/googletest/CMakeLists.txt libgtest-dev
need /usr/include/zlib.h zlib1g-dev

# What travels to the GPU machine: tracked files, untracked files git does not ignore, and .deps
# (the tree is measured before the temporary folder below exists: git would count it).
tree_kb=$(git ls-files -z --cached --others --exclude-standard | du -ck --files0-from=- 2>/dev/null |
  tail -1 | cut -f1)

# Fill a fresh folder, then swap it in: an interrupted run never leaves a half-filled .deps.
tmp=.deps.tmp
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"/eigen3 "$tmp"/json/include "$tmp"/tomlplusplus/include "$tmp"/googletest "$tmp"/zlib
# Eigen: the headers only (unsupported/ is not used).
cp -r /usr/include/eigen3/Eigen /usr/include/eigen3/signature_of_eigen3_matrix_library "$tmp"/eigen3/
cp -r /usr/include/nlohmann "$tmp"/json/include/
cp -r /usr/include/toml++ "$tmp"/tomlplusplus/include/
# GoogleTest without googlemock (cmake/bundled_deps.cmake sets BUILD_GMOCK=OFF).
cp /usr/src/googletest/CMakeLists.txt "$tmp"/googletest/
cp -r /usr/src/googletest/googletest "$tmp"/googletest/
cp /usr/include/zlib.h /usr/include/zconf.h "$tmp"/zlib/

define() { sed -n "s/^#define $2 *\([0-9A-Za-z.\"]*\).*/\1/p" "$1" | head -1 | tr -d '"'; }
macros=/usr/include/eigen3/Eigen/src/Core/util/Macros.h
json=/usr/include/nlohmann/detail/abi_macros.hpp
[ -f "$json" ] || json=/usr/include/nlohmann/json.hpp
toml=/usr/include/toml++/impl/version.h
{
  echo "# What scripts/pack-gpu-deps.sh packed, $(date -u +%Y-%m-%d)"
  echo "eigen3 $(define $macros EIGEN_WORLD_VERSION).$(define $macros EIGEN_MAJOR_VERSION).$(define $macros EIGEN_MINOR_VERSION)"
  echo "nlohmann_json $(define $json NLOHMANN_JSON_VERSION_MAJOR).$(define $json NLOHMANN_JSON_VERSION_MINOR).$(define $json NLOHMANN_JSON_VERSION_PATCH)"
  echo "tomlplusplus $(define $toml TOML_LIB_MAJOR).$(define $toml TOML_LIB_MINOR).$(define $toml TOML_LIB_PATCH)"
  echo "googletest $(sed -n 's/^set(GOOGLETEST_VERSION \(.*\))/\1/p' /usr/src/googletest/CMakeLists.txt)"
  echo "zlib-headers $(define /usr/include/zlib.h ZLIB_VERSION)"
} > "$tmp"/MANIFEST

deps_kb=$(du -sk "$tmp" | cut -f1)
files=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz
       t10k-labels-idx1-ubyte.gz)
if [ "$data" = 1 ]; then
  data_kb=0
  for f in "${files[@]}"; do
    if [ ! -f "$fashion/$f" ]; then
      echo "pack-gpu-deps: no $fashion/$f (Debian package dataset-fashion-mnist, or set" \
        "GALLEY_FASHION_MNIST_DIR); the GPU check will skip the Fashion-MNIST runs" >&2
      data=0
      break
    fi
    data_kb=$((data_kb + $(du -k "$fashion/$f" | cut -f1)))
  done
  # A margin of 2 MiB under the limit for files added before the run.
  if [ "$data" = 1 ] && [ $((tree_kb + deps_kb + data_kb)) -gt $(((limit_mb - 2) * 1024)) ]; then
    echo "pack-gpu-deps: Fashion-MNIST ($((data_kb / 1024)) MiB) would take the tree past" \
      "${limit_mb} MiB; left out (the GPU check skips the Fashion-MNIST runs)" >&2
    data=0
  fi
  if [ "$data" = 1 ]; then
    mkdir -p "$tmp"/fashion-mnist
    for f in "${files[@]}"; do cp "$fashion/$f" "$tmp"/fashion-mnist/; done
    echo "fashion-mnist ${files[*]}" >> "$tmp"/MANIFEST
  fi
fi

rm -rf .deps
mv "$tmp" .deps
trap - EXIT
deps_kb=$(du -sk .deps | cut -f1)
total_mb=$(((tree_kb + deps_kb + 1023) / 1024))
echo "pack-gpu-deps: .deps is $((deps_kb / 1024)) MiB; with the tree, $total_mb MiB travel" \
  "(limit ${limit_mb} MiB)"
sed 's/^/  /' .deps/MANIFEST
if [ "$total_mb" -gt "$limit_mb" ]; then
  echo "pack-gpu-deps: over the limit; run with --no-data, or remove large untracked files" >&2
  exit 1
fi
