#!/usr/bin/env bash
# The main job: install dependencies, build, and train the Fashion-MNIST CNN (5 epochs).
# Arguments go to the example (e.g. --epochs 1).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DGALLEY_BUILD_TESTS=OFF -DGALLEY_BUILD_BENCHMARKS=OFF
exec build/examples/fashion_mnist "$@"
