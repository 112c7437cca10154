#!/usr/bin/env bash
# The host kernels compile for other CPUs than this one: the default build takes -march=native,
# so code that only an AVX-512 (or AVX512-BF16) host compiles would break a build on an AVX2 host
# unseen. Every kernels/cpu/*.cpp is compiled for syntax (-fsyntax-only, no object, a few seconds
# a file) with the build's flags for x86-64 (no AVX), x86-64-v3 (AVX2 and FMA) and
# skylake-avx512 (AVX-512 without BF16); any error fails the check.
#   scripts/check-portable.sh [-j JOBS]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"
[ "${1:-}" = -j ] && jobs="$2"
flags=(-std=gnu++17 -fsyntax-only -O2 -DNDEBUG -DEIGEN_DONT_PARALLELIZE -fopenmp -fno-math-errno
       -Wall -Wextra -Wno-missing-field-initializers -Iinclude -Isrc -I. -isystem /usr/include/eigen3)
failed=0
for march in x86-64 x86-64-v3 skylake-avx512; do
  if ! printf '%s\n' kernels/cpu/*.cpp |
      xargs -P "$jobs" -I{} sh -c 'c++ "$@" {} 2>&1 | grep -E "error:" >&2 && exit 1 || exit 0' \
        _ "${flags[@]}" -march="$march"; then
    echo "check-portable: the host kernels do not compile with -march=$march (errors above)" >&2
    failed=1
  fi
done
[ "$failed" = 0 ] && echo "check-portable: kernels/cpu compiles for x86-64, x86-64-v3 and skylake-avx512"
exit "$failed"
