#!/usr/bin/env bash
# The GPU check: on a machine with a GPU (and PyTorch with CUDA), configure and build galley with
# its CUDA backend, run the GPU-labelled tests, the PyTorch GPU reference benchmarks, and two
# memory-capped processes side by side; write everything as JSON/text into OUT_DIR.
# Usage: scripts/gpu-check.sh OUT_DIR        (budget: about 8 minutes on one H200)
# GALLEY_FASHION_DIR points at the Fashion-MNIST IDX files when they are not in the Debian place.
# A machine that cannot install packages needs .deps (scripts/pack-gpu-deps.sh, run where the
# packages are) next to the sources; cmake/bundled_deps.cmake takes what the system lacks from it.
set -uo pipefail
out="${1:?usage: scripts/gpu-check.sh OUT_DIR}"
mkdir -p "$out"
cd "$(dirname "$0")/.."
log() { echo "[gpu-check $(date +%H:%M:%S)] $*" | tee -a "$out/gpu-check.log"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.csv" 2>&1 || true
git rev-parse HEAD > "$out/commit.txt" 2>/dev/null || true

# cuDNN and NCCL may come only inside Python's nvidia-* wheels: point CMake at them.
hints=()
py=$(command -v python3 || true)
if [ -n "$py" ]; then
  for lib in cudnn nccl; do
    dir=$("$py" -c "import nvidia.$lib, os; print(os.path.dirname(nvidia.$lib.__file__))" 2>/dev/null || true)
    [ -n "$dir" ] && hints+=("-D${lib^^}_ROOT=$dir")
  done
fi
log "configure (hints: ${hints[*]:-none})"
# One architecture (the machine's) keeps the build short; the libtorch reference is CPU-only.
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DGALLEY_WITH_CUDA=ON -DGALLEY_BUILD_BENCHMARKS=ON \
  -DGALLEY_BENCH_LIBTORCH=OFF -DGALLEY_BUILD_LAUNCHER=ON -DCMAKE_CUDA_ARCHITECTURES="${arch:-90}" \
  "${hints[@]}" > "$out/configure.log" 2>&1 || { log "configure failed"; tail -30 "$out/configure.log"; exit 1; }
log "build"
# Only what this script runs: the GPU tests, the train-step benchmark, the example, the launcher.
targets=(bench_train_step fashion_mnist galley-launch)
for t in tests/test_cuda*.cpp tests/test_nccl.cpp; do targets+=("$(basename "$t" .cpp)"); done
cmake --build build-gpu -j "$(nproc)" --target "${targets[@]}" > "$out/build.log" 2>&1 ||
  { log "build failed"; tail -50 "$out/build.log"; exit 1; }

log "GPU tests"
(cd build-gpu && ctest -L gpu --output-on-failure --output-junit "$out/gpu-tests.xml") > "$out/gpu-tests.log" 2>&1
log "GPU tests: $(grep -E 'tests passed' "$out/gpu-tests.log" || echo 'see gpu-tests.log')"
# A CUDA runtime newer than the driver makes galley see no device: every GPU test would then
# skip and the run look green. Say so loudly.
if nvidia-smi -L > /dev/null 2>&1 &&
  build-gpu/tests/test_cuda --gtest_filter='Cuda.DeviceNameAndMemory' 2>&1 | grep -q SKIPPED; then
  log "ERROR: galley sees no GPU although nvidia-smi lists one (driver: $(cat "$out/gpu.csv" | tail -1)); the GPU tests were skipped"
fi

log "galley train step on the GPU (eager and CUDA graph)"
for model in simple fashion; do
  for batch in 64 256; do
    for graph in "" --graph; do
      timeout 120 build-gpu/benchmarks/bench_train_step --device cuda:0 --model "$model" \
        --batch "$batch" --warmup 10 --iters 50 --repeats 5 --json $graph \
        >> "$out/galley-train-step-gpu.jsonl" 2>> "$out/galley-bench.log" ||
        log "galley $model batch $batch $graph failed (see galley-bench.log)"
    done
  done
done

fashion="${GALLEY_FASHION_DIR:-/usr/share/datasets/fashion-mnist}"
if [ -d "$fashion" ]; then
  log "Fashion-MNIST example, 2 epochs on the GPU"
  timeout 180 build-gpu/examples/fashion_mnist --epochs 2 --data "$fashion" --device cuda:0 \
    > "$out/fashion-gpu.log" 2>&1 || log "fashion example failed (see fashion-gpu.log)"
  log "PyTorch's Fashion-MNIST epochs on the GPU (same model, optimizer and batch)"
  timeout 180 "$py" benchmarks/time_to_accuracy_torch.py --data "$fashion" --device cuda \
    --epochs 2 --target 2 --eval-every 1000000 --json > "$out/torch-fashion-gpu.json" \
    2> "$out/torch-fashion-gpu.log" || log "PyTorch Fashion-MNIST run failed (see torch-fashion-gpu.log)"
fi

log "PyTorch reference (eager and torch.compile)"
timeout 400 "$py" benchmarks/gpu/torch_train_step_gpu.py --out "$out/torch-train-step-gpu.json" \
  > "$out/torch-bench.log" 2>&1 || log "PyTorch reference failed (see torch-bench.log)"

log "two processes capped at 0.4 of the GPU, side by side"
cat > "$out/capped-jobs.toml" <<TOML
[[job]]
name = "capped-a"
command = ["$(pwd)/build-gpu/tests/test_cuda"]
gpus = [0]
memory_fraction = 0.4
[[job]]
name = "capped-b"
command = ["$(pwd)/build-gpu/tests/test_cuda"]
gpus = [0]
memory_fraction = 0.4
TOML
if [ -x build-gpu/tools/launch/galley-launch ]; then
  timeout 120 build-gpu/tools/launch/galley-launch --log-dir "$out/capped-logs" "$out/capped-jobs.toml" \
    > "$out/capped.log" 2>&1 && log "capped jobs: both passed" || log "capped jobs failed (see capped.log)"
fi
log "summary"
"$py" benchmarks/gpu/summarize.py "$out" > "$out/summary.log" 2>&1 || log "summary failed"
cat "$out/gpu-train-step.md" 2>/dev/null
log "done; results in $out"
