#!/usr/bin/env bash
# The whole test suite: install dependencies, build everything, run every ctest test
# (unit, gradient checks, PyTorch parity, install/find_package, the Fashion-MNIST accuracy run),
# the GPU check's dry run (scripts/gpu-check.sh --dry-run, its own build in build-gpu-dry),
# then the DataLoader tests under ThreadSanitizer (their own build in build-tsan), the CPU unit
# tests under AddressSanitizer + UBSan (build-asan) and a short libFuzzer run of each parser
# (clang, build-fuzz), and the host kernels compiled for other CPUs than this one
# (scripts/check-portable.sh: x86-64, AVX2, AVX-512 without BF16).
# Pass ctest arguments to narrow it, e.g. scripts/test.sh -L unit  or  -LE slow; a narrowed run
# skips the GPU dry run, ThreadSanitizer, AddressSanitizer, fuzzing and portability stages unless
# GALLEY_GPU_DRY=1 / GALLEY_TSAN=1 / GALLEY_ASAN=1 / GALLEY_FUZZ=1 / GALLEY_PORTABLE=1.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DGALLEY_BUILD_TESTS=ON -DGALLEY_REQUIRE_PARITY=ON
(cd build && ctest --output-on-failure -j "$(nproc)" "$@")

# The default build compiles for this host's vector instructions (-march=native): the host
# kernels must compile for the others too.
if [ $# -eq 0 ] || [ "${GALLEY_PORTABLE:-0}" = 1 ]; then
  scripts/check-portable.sh
fi

# The GPU check's dry run: configures and builds, from .deps alone and in a fresh build-gpu-dry,
# what the GPU machine would build, lists every test and benchmark it would start and estimates
# each phase's time, so that the check does not rot where there is no GPU. GALLEY_GPU_DRY=1 runs
# it in a narrowed run too.
if [ $# -eq 0 ] || [ "${GALLEY_GPU_DRY:-0}" = 1 ]; then
  [ -d .deps ] || scripts/pack-gpu-deps.sh
  scripts/gpu-check.sh --dry-run build/gpu-dry-run
fi

if [ $# -eq 0 ] || [ "${GALLEY_TSAN:-0}" = 1 ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Release -DGALLEY_TSAN_TESTS=ON \
    -DGALLEY_BUILD_EXAMPLES=OFF -DGALLEY_BUILD_BENCHMARKS=OFF "${launcher[@]}"
  cmake --build build-tsan -j "$(nproc)" --target test_dataloader_tsan
  (cd build-tsan && ctest -L tsan --output-on-failure)
  # The whole library under ThreadSanitizer for the tests whose threads share tensors:
  # DataParallel's replica and communication threads, concurrent autograd graphs, and the
  # kernels' worker threads.
  cmake -S . -B build-tsan-lib -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGALLEY_WITH_CUDA=OFF \
    -DGALLEY_WITH_MPI=OFF -DGALLEY_BUILD_EXAMPLES=OFF -DGALLEY_BUILD_BENCHMARKS=OFF \
    -DGALLEY_BUILD_LAUNCHER=OFF -DCMAKE_CXX_FLAGS="-fsanitize=thread -O1 -g" \
    -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread \
    "${launcher[@]}"
  cmake --build build-tsan-lib -j "$(nproc)" --target test_data_parallel test_autograd test_threads
  for t in test_data_parallel test_autograd; do
    OMP_NUM_THREADS=1 GALLEY_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1" "build-tsan-lib/tests/$t"
  done
  # galley's own worker threads (parallel_for), with several threads per region.
  TSAN_OPTIONS="halt_on_error=1" build-tsan-lib/tests/test_threads
fi

# The CPU unit tests against a library built with AddressSanitizer and UndefinedBehaviorSanitizer
# (its own build in build-asan, no CUDA), with galley-launch's unit and integration tests: an
# out-of-bounds access, use after free, leak, signed overflow or misaligned load in any CPU
# kernel, in the core or in the launcher fails the stage.
if [ $# -eq 0 ] || [ "${GALLEY_ASAN:-0}" = 1 ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  sanitize="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
  # -O1 -g1: quicker to build than -O2 -g, with the line numbers a report needs.
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DGALLEY_WITH_CUDA=OFF -DGALLEY_WITH_MPI=OFF -DGALLEY_BUILD_EXAMPLES=OFF -DGALLEY_BUILD_BENCHMARKS=OFF \
    -DCMAKE_CXX_FLAGS="$sanitize" -DCMAKE_EXE_LINKER_FLAGS="$sanitize" \
    -DCMAKE_SHARED_LINKER_FLAGS="$sanitize" "${launcher[@]}"
  cmake --build build-asan -j "$(nproc)"
  # allocator_may_return_null: the out-of-memory tests ask for more than the machine has and
  # expect OutOfMemoryError, not the sanitizer's report of a failed allocation.
  (cd build-asan && ASAN_OPTIONS="allocator_may_return_null=1:detect_leaks=1" \
     UBSAN_OPTIONS="print_stacktrace=1" ctest -L 'unit|launch' --output-on-failure -j "$(nproc)")
fi

# libFuzzer: every parser of outside input for a short run from its seed corpus (clang,
# build-fuzz). GALLEY_FUZZ_SECONDS sets each target's time.
if [ $# -eq 0 ] || [ "${GALLEY_FUZZ:-0}" = 1 ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S tests/fuzz -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}"
  cmake --build build-fuzz -j "$(nproc)"
  seconds="${GALLEY_FUZZ_SECONDS:-30}"
  for target in safetensors idx cifar job_file; do
    extra=()
    [ "$target" = cifar ] && extra=(-max_len=8192)  # room for two 3,074-byte records
    [ "$target" = job_file ] && extra=(-dict=tests/fuzz/job_file.dict)
    # A fresh copy of the seed corpus, so the run never writes into the source tree.
    rm -rf "build-fuzz/corpus-$target" && cp -r "tests/fuzz/corpus/$target" "build-fuzz/corpus-$target"
    "build-fuzz/fuzz_$target" -max_total_time="$seconds" -print_final_stats=1 "${extra[@]}" \
      -artifact_prefix="build-fuzz/crash-$target-" "build-fuzz/corpus-$target"
    echo "fuzz_$target: no crash in $seconds s"
  done
fi
