#!/usr/bin/env bash
# The whole test suite: install dependencies, build everything, run every ctest test
# (unit, gradient checks, PyTorch parity, install/find_package, the Fashion-MNIST accuracy run).
# Pass ctest arguments to narrow it, e.g. scripts/test.sh -L unit  or  -LE slow.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DGALLEY_BUILD_TESTS=ON -DGALLEY_REQUIRE_PARITY=ON
cd build
ctest --output-on-failure -j "$(nproc)" "$@"
