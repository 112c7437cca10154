#!/usr/bin/env bash
# The GPU check: on a machine with a GPU (and PyTorch with CUDA), configure and build galley with
# its CUDA backend, run the GPU-labelled tests, the PyTorch GPU reference benchmarks, and two
# memory-capped processes side by side; write everything as JSON/text into OUT_DIR.
# Usage: scripts/gpu-check.sh OUT_DIR        (budget: about 8 minutes on one H200)
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
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DGALLEY_WITH_CUDA=ON -DGALLEY_BUILD_BENCHMARKS=OFF \
  -DGALLEY_BUILD_LAUNCHER=ON "${hints[@]}" > "$out/configure.log" 2>&1 || { log "configure failed"; exit 1; }
log "build"
cmake --build build-gpu -j "$(nproc)" > "$out/build.log" 2>&1 || { log "build failed"; tail -50 "$out/build.log"; exit 1; }

log "GPU tests"
(cd build-gpu && ctest -L gpu --output-on-failure --output-junit "$out/gpu-tests.xml") > "$out/gpu-tests.log" 2>&1
log "GPU tests: $(grep -E 'tests passed' "$out/gpu-tests.log" || echo 'see gpu-tests.log')"

log "PyTorch reference (eager and torch.compile)"
timeout 300 "$py" benchmarks/gpu/torch_simple_cnn_gpu.py --out "$out/torch-simple-cnn-gpu.json" \
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
log "done; results in $out"
