#!/usr/bin/env bash
# The GPU check, in two phases that each fit one command on a borrowed GPU machine (each well
# under 8 minutes on one H200 with 16 cores; docs/benchmarks/README.md says how to run them):
#
#   scripts/gpu-check.sh build-test OUT   check every prerequisite, configure for this machine's
#                                         GPU alone, build only what the GPU run needs, time
#                                         galley's BatchNorm kernels against cuDNN's, run the
#                                         GPU tests (ctest -L gpu --timeout 90)
#   scripts/gpu-check.sh bench OUT        galley's train step eager and as a CUDA graph and
#                                         PyTorch's eager and torch.compile step (SimpleCNN, the
#                                         Fashion-MNIST CNN and resnet, batch 64 and 256), two
#                                         memory-capped jobs side by side under galley-launch,
#                                         the Fashion-MNIST example beside PyTorch's; it reuses
#                                         the build of build-test when it is there
#   scripts/gpu-check.sh --dry-run [build-test|bench] OUT
#                                         on a machine without a GPU (and with no network or
#                                         package installs): configure and build from .deps alone
#                                         in a fresh build-gpu-dry, list every test and benchmark
#                                         the real run would start with its time limit, and
#                                         estimate each phase's time; both phases when none is
#                                         named. scripts/test.sh runs it.
#
# OUT (made absolute) receives at most 8 files per phase, also when a phase fails midway:
#   build-test: build-test.log build-test.json configure.log build.log gpu-tests.log gpu-tests.xml
#               batch-norm-gpu.jsonl
#   bench:      bench.log bench.json bench-steps.log galley-train-step-gpu.jsonl
#               torch-train-step-gpu.json gpu-train-step.md gpu-train-step.json
# PHASE.log is the story of the run and PHASE.json its figures: the machine, each step's command,
# time limit, duration and status, the test counts, the errors.
#
# What the GPU machine needs of its own: an NVIDIA GPU and driver, nvcc (PATH, CUDACXX or
# /usr/local/cuda), cuBLAS, cuDNN and NCCL (also from Python's nvidia-cudnn-cu* / nvidia-nccl-cu*
# packages), CMake 3.22+, a C and a C++ compiler with OpenMP, zlib's library, and python3 with
# torch for the PyTorch runs. Everything else travels in .deps (scripts/pack-gpu-deps.sh).
#
# Environment: GALLEY_GPU_CHECK_BUDGET (seconds for the phase; default 360 for build-test, 420
# for bench), GALLEY_COMMIT (the commit tested, for a copy of the tree without git),
# GALLEY_CUDA_ARCH (default: the GPU's compute capability, else 90), GALLEY_PYTHON (default
# python3), GALLEY_FASHION_MNIST_DIR (default .deps/fashion-mnist), GALLEY_GPU_CHECK_TEST_JOBS
# (parallel GPU tests, default 1), GALLEY_GPU_CHECK_REBUILD=1 (bench: rebuild even when the
# binaries exist), CUDNN_ROOT / NCCL_ROOT (where those are, when not found otherwise).
set -uo pipefail

usage() {
  sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
dry=0
if [ "${1:-}" = --dry-run ]; then
  dry=1
  shift
fi
case $# in
  1) [ "$dry" = 1 ] || usage; phase=all; out=$1 ;;
  2) phase=$1; out=$2 ;;
  *) usage ;;
esac
case "$phase" in
  build-test | bench) ;;
  all) [ "$dry" = 1 ] || usage ;;
  *) usage ;;
esac
mkdir -p "$out" || { echo "gpu-check: cannot create $out" >&2; exit 2; }
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.." || exit 2
root=$(pwd)

if [ "$dry" = 1 ]; then build="$root/build-gpu-dry"; else build="$root/build-gpu"; fi
case "$out/" in
  "$build/"*) echo "gpu-check: OUT must lie outside $build" >&2; exit 2 ;;
esac
ncores=$(nproc)
# A dry run in build-gpu-dry starts from nothing, as the GPU machine does.
if [ "$dry" = 1 ] && [ "$phase" != bench ]; then rm -rf "$build"; fi

# ---------------------------------------------------------------------------------------------
# Logging, steps with time limits, and the JSON summary

t_start=$(date +%s)
deadline=0
reserve=20          # seconds kept for the summaries at the end
errors=()           # what stops the phase, one clear sentence each
notes=()
step_json=()        # one JSON object per step
tests_json='null'
estimate_json='null'
machine_json='{}'
rc=0
cur=""              # the phase being run (build-test or bench)
mainlog=/dev/null
steplog=/dev/null

js() {  # a JSON string
  local s
  s=$(printf '%s' "$1" | tr -d '\000-\010\013\014\016-\037')
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\t'/\\t}
  s=${s//$'\r'/\\r}
  printf '"%s"' "$s"
}
js_list() {  # a JSON array of strings
  local first=1 x
  printf '['
  for x in "$@"; do
    [ $first = 1 ] || printf ', '
    first=0
    js "$x"
  done
  printf ']'
}
first() {  # the first of its arguments (globs, expanded) that exists
  local f
  for f in "$@"; do [ -e "$f" ] && { printf '%s' "$f"; return 0; }; done
  return 1
}
log() { printf '[gpu-check %s] %s\n' "$(date +%H:%M:%S)" "$*" | tee -a "$mainlog"; }
fail() { errors+=("$1"); log "ERROR: $1"; }
note() { notes+=("$1"); log "note: $1"; }
quote() { local q; printf -v q '%q ' "$@"; printf '%s' "${q% }"; }
left() { echo $((deadline - $(date +%s))); }

write_json() {
  local status=${1:-running} steps
  steps=$(IFS=,; printf '%s' "${step_json[*]}")
  {
    printf '{\n  "phase": %s, "dry_run": %s, "status": %s,\n' "$(js "$cur")" \
      "$([ "$dry" = 1 ] && echo true || echo false)" "$(js "$status")"
    printf '  "date": %s, "commit": %s,\n' "$(js "$(date -u '+%Y-%m-%d %H:%M UTC')")" "$(js "$commit")"
    printf '  "budget_s": %s, "elapsed_s": %s,\n' "$budget" "$(($(date +%s) - phase_start))"
    printf '  "machine": %s,\n' "$machine_json"
    printf '  "errors": %s,\n  "notes": %s,\n' "$(js_list "${errors[@]}")" "$(js_list "${notes[@]}")"
    printf '  "steps": [%s],\n' "$steps"
    printf '  "tests": %s,\n  "estimate": %s\n}\n' "$tests_json" "$estimate_json"
  } > "$out/$cur.json.tmp" && mv "$out/$cur.json.tmp" "$out/$cur.json"
}

record() {  # record NAME COMMAND LIMIT SECONDS STATUS RC
  step_json+=("$(printf '\n    {"name": %s, "command": %s, "limit_s": %s, "seconds": %s, "status": %s, "rc": %s}' \
    "$(js "$1")" "$(js "$2")" "$3" "$4" "$(js "$5")" "$6")")
  write_json running
}

# step [--dry-list] [--stdout FILE] [--log FILE] NAME LIMIT -- COMMAND...
# Runs COMMAND under `timeout`, its limit cut to what is left of the phase's budget; its output
# goes to the step log (or stdout to FILE). --dry-list: a dry run only lists the command.
# Returns the command's status (124 for a timeout, 125 when skipped for want of time).
step() {
  local list=0 to="" lg="$steplog" name limit cmd t0 t1 dur status r
  while :; do
    case "$1" in
      --dry-list) list=1; shift ;;
      --stdout) to=$2; shift 2 ;;
      --log) lg=$2; shift 2 ;;
      *) break ;;
    esac
  done
  name=$1 limit=$2
  shift 3
  cmd=$(quote "$@")
  if [ "$dry" = 1 ] && [ "$list" = 1 ]; then
    log "would run (limit ${limit} s): $cmd${to:+ >> $(basename "$to")}"
    record "$name" "$cmd" "$limit" 0 listed 0
    return 0
  fi
  if [ "$dry" = 0 ]; then
    local room=$(($(left) - reserve))
    if [ "$room" -lt 10 ]; then
      log "$name: skipped, the phase's budget is spent ($((room + reserve)) s left)"
      record "$name" "$cmd" "$limit" 0 "skipped: no time left" 125
      return 125
    fi
    [ "$limit" -gt "$room" ] && limit=$room
  fi
  log "$name (limit ${limit} s): $cmd"
  printf '\n### %s: %s\n' "$name" "$cmd" >> "$lg"
  t0=$(date +%s.%N)
  if [ -n "$to" ]; then
    timeout -k 10 "$limit" "$@" >> "$to" 2>> "$lg"
  else
    timeout -k 10 "$limit" "$@" >> "$lg" 2>&1
  fi
  r=$?
  t1=$(date +%s.%N)
  dur=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  case $r in
    0) status=ok ;;
    124 | 137) status="timed out after ${limit} s" ;;
    *) status="failed (exit $r)" ;;
  esac
  log "$name: $status, ${dur} s"
  if [ $r -ne 0 ]; then
    tail -n 25 "$lg" | sed 's/^/    | /' | tee -a "$mainlog"
  fi
  record "$name" "$cmd" "$limit" "$dur" "$status" "$r"
  return $r
}

# ---------------------------------------------------------------------------------------------
# Prerequisites: everything is checked before anything starts, each with one clear message.

commit="${GALLEY_COMMIT:-}"
if [ -z "$commit" ] && git -C "$root" rev-parse HEAD > /dev/null 2>&1; then
  commit=$(git -C "$root" rev-parse HEAD)
  [ -n "$(git -C "$root" status --porcelain --untracked-files=no 2> /dev/null)" ] && commit+=" (modified)"
fi
commit=${commit:-unknown}

py=""; nvcc=""; cuda_home=""; arch=""; gpu_name=""; gpu_mem=""; driver=""; cuda_flags=""
cmake_bin=""; ctest_bin=ctest; gen=""; cxx=""; torch_version=""; torch_ok=0; fashion=""
cudnn_root=""; nccl_root=""; extra_cmake=(); ld_dirs=()

# find_nv NAME HEADER LIB ENVVAR: cuDNN or NCCL, from $ENVVAR, Python's nvidia.NAME (a namespace
# package: its folder is __path__[0], __file__ is None), the toolkit or the system. Sets nv_root,
# nv_lib and nv_how.
find_nv() {
  local name=$1 header=$2 lib=$3 envvar=$4 roots=() hows=() r i l d
  if [ -n "${!envvar:-}" ]; then roots+=("${!envvar}"); hows+=("$envvar"); fi
  if [ -n "$py" ]; then
    r=$(timeout 60 "$py" -c "import nvidia.$name as m; print(list(m.__path__)[0])" 2> /dev/null) &&
      [ -n "$r" ] && { roots+=("$r"); hows+=("Python's nvidia.$name package"); }
  fi
  [ -n "$cuda_home" ] && { roots+=("$cuda_home"); hows+=("the CUDA toolkit"); }
  roots+=(/usr/local/cuda /usr); hows+=("the CUDA toolkit" "the system")
  nv_root=""; nv_lib=""; nv_how=""
  for i in "${!roots[@]}"; do
    r=${roots[$i]}
    [ -f "$r/include/$header" ] || continue
    l=""
    for d in lib lib64 lib/x86_64-linux-gnu targets/x86_64-linux/lib; do
      l=$(first "$r/$d/$lib".so*)
      [ -n "$l" ] && break
    done
    [ -z "$l" ] && [ "$r" != /usr ] && l=$(find "$r" -maxdepth 3 -name "$lib.so*" -print -quit 2> /dev/null)
    if [ -n "$l" ]; then
      nv_root=$r nv_lib=$l nv_how=${hows[$i]}
      return 0
    fi
  done
  return 1
}

prereqs() {
  local smi line v major minor probe_dir r out_probe
  probe_dir="$build/gpu-check-probe"
  mkdir -p "$probe_dir"

  # The GPU and its architecture.
  smi=$(command -v nvidia-smi || ls /usr/local/nvidia/bin/nvidia-smi 2> /dev/null || true)
  line=""
  [ -n "$smi" ] && line=$(timeout 30 "$smi" --query-gpu=name,memory.total,driver_version,compute_cap \
    --format=csv,noheader 2> /dev/null | head -1)
  if [ -n "$line" ]; then
    IFS=, read -r gpu_name gpu_mem driver v <<< "$line"
    gpu_name=$(echo "$gpu_name" | xargs); gpu_mem=$(echo "$gpu_mem" | xargs)
    driver=$(echo "$driver" | xargs); arch=$(echo "$v" | tr -d ' .')
    log "GPU: $gpu_name, $gpu_mem, driver $driver, compute capability ${v// /}"
  elif [ "$dry" = 1 ]; then
    note "no GPU here, as expected in a dry run"
  else
    fail "no GPU: $([ -n "$smi" ] && echo "nvidia-smi lists none" || echo "nvidia-smi is not installed") (this check needs an NVIDIA GPU and its driver)"
  fi
  case "${GALLEY_CUDA_ARCH:-$arch}" in
    [0-9][0-9]*) arch=${GALLEY_CUDA_ARCH:-$arch} ;;
    *) arch=90 ;;
  esac
  log "CUDA architecture: $arch alone"

  # nvcc, exported for CMake (CUDACXX) and for every step (PATH).
  if [ -n "${CUDACXX:-}" ] && [ -x "${CUDACXX}" ]; then nvcc=$CUDACXX; else nvcc=$(command -v nvcc || true); fi
  if [ -z "$nvcc" ]; then
    for v in "${CUDA_HOME:-}/bin/nvcc" "${CUDA_PATH:-}/bin/nvcc" /usr/local/cuda/bin/nvcc; do
      [ -x "$v" ] && { nvcc=$v; break; }
    done
  fi
  if [ -z "$nvcc" ]; then
    fail "nvcc not found (not on PATH, CUDACXX, CUDA_HOME or /usr/local/cuda/bin): install the CUDA toolkit"
  else
    PATH="$(dirname "$nvcc"):$PATH"
    CUDACXX=$nvcc
    export PATH CUDACXX
    cuda_home=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
    log "nvcc: $nvcc ($("$nvcc" --version 2> /dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')), CUDACXX and PATH exported"
  fi

  # python3 (for cuDNN / NCCL in Python's packages, and PyTorch).
  py=$(command -v "${GALLEY_PYTHON:-python3}" || true)
  if [ -z "$py" ]; then
    note "python3 not found: the PyTorch runs and the summary need it (set GALLEY_PYTHON)"
  else
    v=$(timeout 120 "$py" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())' 2> /dev/null | tail -1)
    if [ -n "$v" ]; then
      torch_version=${v%% *}; torch_ok=1
      log "python3: $py, torch $torch_version (CUDA ${v#* }; GPU usable: ${v##* })"
      [ "$dry" = 0 ] && [ "${v##* }" != True ] && note "torch sees no GPU: the PyTorch runs will fail"
    elif [ "$dry" = 1 ]; then
      note "$py cannot import torch (a dry run does not need it; the bench phase does)"
    else
      note "$py cannot import torch: the bench phase's PyTorch runs will be skipped"
    fi
  fi

  # CMake (also the one of Python's cmake package, next to python3), and ninja when there.
  cmake_bin=$(command -v cmake || true)
  [ -z "$cmake_bin" ] && [ -n "$py" ] && [ -x "$(dirname "$py")/cmake" ] && cmake_bin="$(dirname "$py")/cmake"
  if [ -z "$cmake_bin" ]; then
    fail "cmake not found (CMake 3.22 or newer is needed)"
  else
    v=$("$cmake_bin" --version | sed -n 's/^cmake version \([0-9.]*\).*/\1/p')
    major=${v%%.*}; minor=${v#*.}; minor=${minor%%.*}
    if [ "${major:-0}" -lt 3 ] || { [ "$major" -eq 3 ] && [ "${minor:-0}" -lt 22 ]; }; then
      fail "cmake $v at $cmake_bin is too old (3.22 or newer is needed)"
    else
      PATH="$(dirname "$cmake_bin"):$PATH"
      export PATH
      ctest_bin="$(dirname "$cmake_bin")/ctest"
      [ -x "$ctest_bin" ] || ctest_bin=ctest
      log "cmake: $cmake_bin ($v)"
    fi
  fi
  gen="Unix Makefiles"
  if ! command -v ninja > /dev/null && [ -n "$py" ] && [ -x "$(dirname "$py")/ninja" ]; then
    PATH="$PATH:$(dirname "$py")"  # Python's ninja package
    export PATH
  fi
  command -v ninja > /dev/null && gen=Ninja
  log "generator: $gen"

  # C and C++ compilers, OpenMP (GoogleTest's project needs C too).
  cxx=${CXX:-$(command -v c++ || command -v g++ || true)}
  local cc=${CC:-$(command -v cc || command -v gcc || true)}
  if [ -z "$cxx" ]; then
    fail "no C++ compiler (c++ or g++, or set CXX)"
  elif ! printf '#include <omp.h>\nint main() { return omp_get_max_threads() > 0 ? 0 : 1; }\n' |
    timeout 60 "$cxx" -std=c++17 -fopenmp -x c++ - -o "$probe_dir/omp" > "$probe_dir/omp.log" 2>&1; then
    fail "$cxx cannot build a C++17 OpenMP program: $(head -c 300 "$probe_dir/omp.log" | tr '\n' ' ')"
  else
    log "C++ compiler: $cxx ($("$cxx" -dumpfullversion 2> /dev/null || "$cxx" -dumpversion)), OpenMP works"
  fi
  if [ -z "$cc" ]; then
    fail "no C compiler (cc or gcc, or set CC): GoogleTest's CMake project needs one"
  fi

  # A plain CUDA program for this architecture: the host compiler suits nvcc, cudart links, and
  # (on the GPU machine) the driver runs what this toolkit builds.
  if [ -n "$nvcc" ] && [ -n "$cxx" ]; then
    cat > "$probe_dir/probe.cu" << 'CU'
#include <cstdio>
__global__ void twice(int* x) { x[threadIdx.x] *= 2; }
int main() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) { std::printf("cudaGetDeviceCount: %s\n", cudaGetErrorString(e)); return 1; }
  int* d = nullptr; int h[32]; for (int i = 0; i < 32; ++i) h[i] = i;
  if (cudaMalloc(&d, sizeof h) != cudaSuccess) { std::printf("cudaMalloc failed\n"); return 1; }
  cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
  twice<<<1, 32>>>(d);
  e = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess || h[31] != 62) { std::printf("kernel: %s\n", cudaGetErrorString(e)); return 1; }
  cudaDeviceProp p; cudaGetDeviceProperties(&p, 0);
  std::printf("%d device(s); %s, %d SMs, compute %d.%d; a kernel ran\n", n, p.name, p.multiProcessorCount, p.major, p.minor);
  return 0;
}
CU
    if ! timeout 120 "$nvcc" -arch="sm_$arch" -o "$probe_dir/probe" "$probe_dir/probe.cu" > "$probe_dir/nvcc.log" 2>&1; then
      if grep -qi "unsupported" "$probe_dir/nvcc.log" &&
        timeout 120 "$nvcc" -allow-unsupported-compiler -arch="sm_$arch" -o "$probe_dir/probe" \
          "$probe_dir/probe.cu" > "$probe_dir/nvcc2.log" 2>&1; then
        cuda_flags=-allow-unsupported-compiler
        note "nvcc rejects $cxx's version; building with -allow-unsupported-compiler"
      else
        fail "nvcc cannot build a CUDA program for sm_$arch: $(head -c 400 "$probe_dir/nvcc.log" | tr '\n' ' ')"
      fi
    fi
    if [ -x "$probe_dir/probe" ] && [ "$dry" = 0 ] && [ -n "$gpu_name" ]; then
      if out_probe=$(timeout 60 "$probe_dir/probe" 2>&1); then
        log "CUDA probe: $out_probe"
      else
        fail "a plain CUDA program built by this nvcc cannot use the GPU ($out_probe); driver $driver may be older than the toolkit"
      fi
    fi
  fi

  # cuBLAS (in the toolkit; a toolkit without the unversioned name, or one that lacks cuBLAS,
  # gets the library's file named to CMake).
  if [ -n "$cuda_home" ]; then
    local d blas="" blaslt=""
    for d in "$cuda_home/lib64" "$cuda_home/targets/x86_64-linux/lib" "$cuda_home/lib"; do
      [ -e "$d/libcublas.so" ] && { blas=toolkit; break; }
    done
    if [ -z "$blas" ]; then
      local cands=("$cuda_home"/lib64 "$cuda_home"/targets/x86_64-linux/lib)
      if [ -n "$py" ]; then
        for v in cu13 cu12 cublas; do
          r=$(timeout 60 "$py" -c "import nvidia.$v as m; print(list(m.__path__)[0])" 2> /dev/null) && cands+=("$r/lib")
        done
      fi
      for d in "${cands[@]}"; do
        blas=$(first "$d"/libcublas.so.[0-9]*)
        blaslt=$(first "$d"/libcublasLt.so.[0-9]*)
        [ -n "$blas" ] && [ -n "$blaslt" ] && break
        blas=""
      done
      if [ -n "$blas" ]; then
        extra_cmake+=("-DCUDA_cublas_LIBRARY=$blas" "-DCUDA_cublasLt_LIBRARY=$blaslt")
        ld_dirs+=("$(dirname "$blas")")
        note "cuBLAS from $blas (the toolkit has no libcublas.so)"
      else
        fail "cuBLAS not found (no libcublas.so in $cuda_home, nor in Python's nvidia packages)"
      fi
    fi
  fi

  # cuDNN and NCCL.
  if find_nv cudnn cudnn.h libcudnn CUDNN_ROOT; then
    cudnn_root=$nv_root; ld_dirs+=("$(dirname "$nv_lib")")
    log "cuDNN: $nv_lib (from $nv_how)"
  else
    fail "cuDNN not found (cudnn.h and libcudnn.so* under CUDNN_ROOT, Python's nvidia-cudnn-cu* package, the toolkit or /usr)"
  fi
  if find_nv nccl nccl.h libnccl NCCL_ROOT; then
    nccl_root=$nv_root; ld_dirs+=("$(dirname "$nv_lib")")
    log "NCCL: $nv_lib (from $nv_how)"
  else
    fail "NCCL not found (nccl.h and libnccl.so* under NCCL_ROOT, Python's nvidia-nccl-cu* package, the toolkit or /usr)"
  fi

  # zlib's library (its headers come from .deps).
  local z
  z=$(compgen -G '/usr/lib/x86_64-linux-gnu/libz.so*' || compgen -G '/lib/x86_64-linux-gnu/libz.so*' ||
    compgen -G '/usr/lib64/libz.so*' || compgen -G '/usr/lib/libz.so*' || true)
  [ -n "$z" ] || fail "zlib's library (libz.so.1) is not installed in /usr/lib or /lib"

  # .deps, which this machine cannot make.
  local missing=()
  [ -f .deps/eigen3/Eigen/Core ] || missing+=(Eigen)
  [ -f .deps/json/include/nlohmann/json.hpp ] || missing+=(nlohmann_json)
  [ -f .deps/tomlplusplus/include/toml++/toml.h ] || missing+=(toml++)
  [ -f .deps/googletest/CMakeLists.txt ] || missing+=(GoogleTest)
  [ -f .deps/zlib/zlib.h ] || missing+=("zlib's headers")
  if [ ! -d .deps ]; then
    fail ".deps is missing: run scripts/pack-gpu-deps.sh on a machine that has the packages (Debian: scripts/install-deps.sh), then carry .deps along with the working tree (git ignores it, so it travels only when named among the paths to carry)"
  elif [ ${#missing[@]} -gt 0 ]; then
    fail ".deps lacks ${missing[*]}: run scripts/pack-gpu-deps.sh again and bring .deps along"
  else
    log ".deps: $(grep -v '^#' .deps/MANIFEST 2> /dev/null | cut -d' ' -f1 | tr '\n' ' ')"
  fi
  fashion=${GALLEY_FASHION_MNIST_DIR:-}
  [ -z "$fashion" ] && [ -f .deps/fashion-mnist/train-images-idx3-ubyte.gz ] && fashion="$root/.deps/fashion-mnist"
  [ -z "$fashion" ] && [ -d /usr/share/datasets/fashion-mnist ] && fashion=/usr/share/datasets/fashion-mnist
  if [ "$cur" = bench ]; then
    if [ -n "$fashion" ]; then log "Fashion-MNIST: $fashion"; else note "no Fashion-MNIST data (.deps/fashion-mnist): its runs are left out"; fi
  fi

  if [ ${#ld_dirs[@]} -gt 0 ]; then
    local joined
    joined=$(printf '%s:' "${ld_dirs[@]}" | sed 's/:$//')
    export LD_LIBRARY_PATH="$joined${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  machine_json=$(printf '{"gpu": %s, "gpu_memory": %s, "driver": %s, "cuda_arch": %s, "nvcc": %s, "cmake": %s, "cxx": %s, "cores": %s, "cpu": %s, "python": %s, "torch": %s, "cudnn": %s, "nccl": %s}' \
    "$(js "$gpu_name")" "$(js "$gpu_mem")" "$(js "$driver")" "$(js "$arch")" \
    "$(js "$("${nvcc:-false}" --version 2> /dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')")" \
    "$(js "$(${cmake_bin:-false} --version 2> /dev/null | head -1)")" \
    "$(js "$([ -n "$cxx" ] && "$cxx" --version 2> /dev/null | head -1)")" "$ncores" \
    "$(js "$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo 2> /dev/null | head -1)")" \
    "$(js "$py")" "$(js "$torch_version")" "$(js "${cudnn_root:+$cudnn_root}")" "$(js "${nccl_root:+$nccl_root}")")
}

# The finder against the layout of Python's nvidia-cudnn / nvidia-nccl packages (namespace
# packages with only the versioned library), which no dry-run machine has: the script's lookup
# and CMake's galley_find_cuda_library must both land in it.
finder_selftest() {
  local fake="$build/gpu-check-probe/site" ok=1 saved_py=$py
  rm -rf "$fake"
  for n in cudnn:cudnn.h:libcudnn.so.9 nccl:nccl.h:libnccl.so.2; do
    IFS=: read -r name header lib <<< "$n"
    mkdir -p "$fake/nvidia/$name/include" "$fake/nvidia/$name/lib"
    : > "$fake/nvidia/$name/include/$header"
    : > "$fake/nvidia/$name/lib/$lib"
  done
  py=$(command -v python3 || true)
  if [ -z "$py" ]; then note "finder self-test skipped (no python3)"; py=$saved_py; return 0; fi
  for n in cudnn:cudnn.h:libcudnn nccl:nccl.h:libnccl; do
    IFS=: read -r name header lib <<< "$n"
    if PYTHONPATH="$fake" find_nv "$name" "$header" "$lib" GALLEY_NO_SUCH_ROOT &&
      [ "$nv_root" = "$fake/nvidia/$name" ]; then :; else
      fail "finder self-test: $name in a namespace-package layout was not found (got '${nv_root:-nothing}')"
      ok=0
    fi
  done
  py=$saved_py
  cat > "$fake/find.cmake" << EOF
include("$root/cmake/cuda.cmake")
set(CMAKE_FIND_LIBRARY_PREFIXES lib)
set(CMAKE_FIND_LIBRARY_SUFFIXES .so)
galley_find_cuda_library(T_CUDNN cudnn cudnn.h "$fake/nvidia/cudnn")
galley_find_cuda_library(T_NCCL nccl nccl.h "$fake/nvidia/nccl")
if(NOT T_CUDNN_LIBRARY STREQUAL "$fake/nvidia/cudnn/lib/libcudnn.so.9" OR
   NOT T_CUDNN_INCLUDE_DIR STREQUAL "$fake/nvidia/cudnn/include" OR
   NOT T_NCCL_LIBRARY STREQUAL "$fake/nvidia/nccl/lib/libnccl.so.2")
  message(FATAL_ERROR "found \${T_CUDNN_LIBRARY} \${T_CUDNN_INCLUDE_DIR} \${T_NCCL_LIBRARY}")
endif()
EOF
  if ! "${cmake_bin:-cmake}" -P "$fake/find.cmake" > "$fake/find.log" 2>&1; then
    fail "finder self-test: cmake/cuda.cmake missed the namespace-package layout: $(tr '\n' ' ' < "$fake/find.log" | head -c 300)"
    ok=0
  fi
  [ $ok = 1 ] && log "finder self-test: cuDNN and NCCL in a namespace-package layout (libcudnn.so.9 / libnccl.so.2 only) are found by the script and by CMake"
}

# ---------------------------------------------------------------------------------------------
# Configure and build

gpu_test_targets() {
  local t
  for t in tests/test_backend_ops.cpp tests/test_cuda*.cpp tests/test_nccl.cpp; do basename "$t" .cpp; done
}
bench_targets=(bench_train_step fashion_mnist galley-launch bench_batch_norm_gpu)

configure() {
  local args=(-S "$root" -B "$build" -G "$gen" -DCMAKE_BUILD_TYPE=Release
    -DGALLEY_WITH_CUDA=ON -DGALLEY_WITH_MPI=OFF -DGALLEY_DEPS_ONLY=ON
    -DGALLEY_BUILD_TESTS=ON -DGALLEY_BUILD_EXAMPLES=ON -DGALLEY_BUILD_BENCHMARKS=ON
    -DGALLEY_BENCH_LIBTORCH=OFF -DGALLEY_BUILD_LAUNCHER=ON -DCMAKE_CUDA_ARCHITECTURES="$arch")
  [ -n "$cudnn_root" ] && args+=("-DCUDNN_ROOT=$cudnn_root")
  [ -n "$nccl_root" ] && args+=("-DNCCL_ROOT=$nccl_root")
  [ -n "$cuda_flags" ] && args+=("-DCMAKE_CUDA_FLAGS=$cuda_flags")
  [ "$torch_ok" = 1 ] && args+=("-DGALLEY_TORCH_PYTHON=$py")
  if command -v ccache > /dev/null; then
    args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  local limit=120
  [ "$dry" = 1 ] && limit=600
  step --log "$out/configure.log" configure "$limit" -- "$cmake_bin" "${args[@]}" "${extra_cmake[@]}"
}

build_targets() {  # build_targets LOGFILE LIMIT TARGET...
  local lg=$1 limit=$2
  shift 2
  rm -f "$ccache_log"
  step --log "$lg" build "$limit" -- env CCACHE_STATSLOG="$ccache_log" "$cmake_bin" --build "$build" -j "$ncores" --target "$@"
}

# ---------------------------------------------------------------------------------------------
# Estimates (dry run): the build from ninja's log, the tests and benchmarks from their limits.

# Milliseconds of each build step here, from ninja's log. A step that ccache served (its stats
# log says which) took a fraction of its real time: it counts at its last real time, remembered
# across runs in times_db.
times_db="${XDG_CACHE_HOME:-$HOME/.cache}/galley/gpu-check-compile-ms.tsv"
ccache_log="$build/gpu-check/ccache-stats.log"

build_estimate() {  # prints: sum_ms chain_ms cached_steps cached_without_record steps
  local nlog="$build/.ninja_log"
  [ -f "$nlog" ] || { echo "0 0 0 0 0"; return; }
  { mkdir -p "$(dirname "$times_db")" && touch "$times_db"; } 2> /dev/null || times_db=/dev/null
  [ -f "$ccache_log" ] || : > "$ccache_log"
  awk -v db="$times_db" -v cc="$ccache_log" -v dbout="$times_db.new" '
    function key2(p,  n, a) { n = split(p, a, "/"); return a[n - 1] "/" a[n] }
    function base(p,  n, a) { n = split(p, a, "/"); return a[n] }
    FILENAME == db { if (NF == 2) known[$1] = $2; next }
    FILENAME == cc {
      if ($1 == "#") { src = $2; next }
      if ($1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit") { hit[base(src)]++; hit2[key2(src)] = 1 }
      else if ($1 == "cache_miss") { miss[base(src)]++; miss2[key2(src)] = 1 }
      next
    }
    /^#/ { next }
    {
      ms = $2 - $1; out = $4; b = base(out); sub(/\.o$/, "", b)
      served = 0
      if (out ~ /\.o$/ && (b in hit)) {
        if (!(b in miss)) served = 1
        else for (k in hit2) if (index(out, "/" k ".o")) served = 1
      }
      if (served) {
        cached++
        if (out in known) ms = known[out]; else unknown++
      } else if (out ~ /\.o$/) known[out] = ms
      sum += ms; n++
      if (out ~ /\.o$/) { if (ms > maxobj) maxobj = ms }
      else if (out ~ /libgalley\.so/) { lib = ms }
      else if (ms > maxlink) maxlink = ms
    }
    END {
      if (db != "/dev/null") for (k in known) print k "\t" known[k] > dbout
      printf "%d %d %d %d %d\n", sum, maxobj + lib + maxlink, cached, unknown, n
    }' "$times_db" "$ccache_log" "$nlog"
  [ -f "$times_db.new" ] && mv "$times_db.new" "$times_db"
}

# ---------------------------------------------------------------------------------------------
# The phases

phase_start=$t_start
budget=0

begin_phase() {  # begin_phase NAME DEFAULT_BUDGET
  cur=$1
  budget=${GALLEY_GPU_CHECK_BUDGET:-$2}
  phase_start=$(date +%s)
  deadline=$((phase_start + budget))
  [ "$dry" = 1 ] && deadline=$((phase_start + 1000000))
  errors=(); notes=(); step_json=(); tests_json=null; estimate_json=null
  mainlog="$out/$cur.log"
  : > "$mainlog"
  mkdir -p "$build/gpu-check"
  log "$cur$([ "$dry" = 1 ] && echo ' (dry run)'): galley at $commit; results in $out; budget ${budget} s"
}

finish_phase() {  # finish_phase STATUS
  local status=$1 n
  write_json "$status"
  n=$(find "$out" -maxdepth 1 -type f \( -name "$cur.*" -o -name 'configure.log' -o -name 'build.log' \
    -o -name 'gpu-tests.*' -o -name 'bench-steps.log' -o -name '*train-step-gpu*' -o -name 'gpu-train-step.*' \
    -o -name 'batch-norm-gpu.jsonl' \) | wc -l)
  log "$cur: $status in $(($(date +%s) - phase_start)) s$([ ${#errors[@]} -gt 0 ] && printf '; %d error(s)' ${#errors[@]})"
  for e in "${errors[@]}"; do log "  - $e"; done
  [ "$dry" = 0 ] && [ "$n" -gt 8 ] && log "warning: $n files in $out (the limit is 8 per phase)"
}

# shellcheck disable=SC2317  # called by the trap
on_exit() {
  local r=$?
  if [ -n "$cur" ] && [ -f "$out/$cur.json" ] && grep -q '"status": "running"' "$out/$cur.json"; then
    fail "the phase stopped early (exit $r)"
    finish_phase "stopped"
  fi
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# galley's BatchNorm kernels against cuDNN's on resnet's BatchNorm shapes, before the GPU tests
# (which take what is left of the budget): the figures that decide whether a step should run
# cuDNN's batch norm or galley's own kernels. A few seconds.
batch_norm_bench() {
  step --dry-list --stdout "$out/batch-norm-gpu.jsonl" "BatchNorm kernels against cuDNN" 30 -- \
    "$build/benchmarks/bench_batch_norm_gpu" --iters 50 --repeats 5 --json ||
    fail "the BatchNorm comparison failed (build.log)"
  [ "$dry" = 0 ] && [ -s "$out/batch-norm-gpu.jsonl" ] && tee -a "$mainlog" < "$out/batch-norm-gpu.jsonl"
  return 0
}

run_build_test() {
  begin_phase build-test 360
  rm -f "$out/configure.log" "$out/build.log" "$out/gpu-tests.log" "$out/gpu-tests.xml" "$out/batch-norm-gpu.jsonl"
  steplog="$out/build.log"
  local t0 t_pre t_conf t_build n targets
  t0=$(date +%s)
  prereqs
  [ "$dry" = 1 ] && finder_selftest
  t_pre=$(($(date +%s) - t0))
  write_json running
  if [ ${#errors[@]} -gt 0 ]; then
    log "not starting: $((${#errors[@]})) prerequisite(s) missing"
    finish_phase "prerequisites missing"
    return 1
  fi

  t0=$(date +%s)
  if ! configure; then
    fail "configure failed (configure.log)"
    finish_phase failed
    return 1
  fi
  t_conf=$(($(date +%s) - t0))
  mapfile -t targets < <(gpu_test_targets)
  targets+=("${bench_targets[@]}")
  log "targets: ${targets[*]}"
  t0=$(date +%s)
  # A dry run on a CI machine with 2 cores and a cold ccache takes far longer than the real one.
  if ! build_targets "$out/build.log" "$([ "$dry" = 1 ] && echo 5400 || echo 300)" "${targets[@]}"; then
    fail "build failed (build.log)"
    finish_phase failed
    return 1
  fi
  t_build=$(($(date +%s) - t0))

  local jobs=${GALLEY_GPU_CHECK_TEST_JOBS:-1}
  if [ "$dry" = 1 ]; then
    step --log "$out/gpu-tests.log" "list GPU tests" 60 -- "$ctest_bin" --test-dir "$build" -N -L gpu
    n=$(sed -n 's/^Total Tests: *\([0-9]*\).*/\1/p' "$out/gpu-tests.log" | tail -1)
    n=${n:-0}
    # Each test with its limit: its TIMEOUT property, else the --timeout 90 of the real run.
    "$ctest_bin" --test-dir "$build" -N -L gpu --show-only=json-v1 > "$build/gpu-check/tests.json" 2> /dev/null
    if [ -n "$(command -v python3)" ]; then
      python3 - "$build/gpu-check/tests.json" << 'PY' | tee -a "$mainlog"
import json, sys
tests = json.load(open(sys.argv[1])).get("tests", [])
for t in tests:
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    print(f"  would run (limit {props.get('TIMEOUT', 90)} s): {t['name']}")
PY
    else
      grep 'Test *#' "$out/gpu-tests.log" | sed 's/^ */  would run (limit 90 s): /' | tee -a "$mainlog"
    fi
    batch_norm_bench
    log "would run: ctest -L gpu --timeout 90 -j $jobs --output-on-failure --output-junit OUT/gpu-tests.xml --stop-time (the phase's end), $n tests"
    log "would run (limit 60 s): $build/tests/test_cuda --gtest_filter=Cuda.DeviceNameAndMemory (galley must see the GPU that nvidia-smi lists)"
    [ "$n" -gt 0 ] || fail "ctest -L gpu lists no tests"
    tests_json=$(printf '{"listed": %s, "limit_s": 90, "jobs": %s}' "$n" "$jobs")

    # The estimate for a 16-core GPU machine.
    local sum crit cached unknown steps est_build t_tests t_total
    read -r sum crit cached unknown steps < <(build_estimate)
    est_build=$(awk -v s="$sum" -v c="$crit" 'BEGIN { a = s / 16000; b = c / 1000; printf "%d", (a > b ? a : b) + 0.5 }')
    t_tests=$(((n * 2 + jobs - 1) / jobs))
    t_total=$((15 + t_conf + est_build + 10 + 5 + t_tests + 10))
    log "estimate for build-test on a 16-core GPU machine: about ${t_total} s of its ${budget} s budget"
    log "  prerequisites ~15 s (measured here: ${t_pre} s; there also a torch import and the CUDA probe run)"
    log "  configure ~${t_conf} s (as here: compiler checks run one at a time)"
    log "  build ~${est_build} s: the $steps build steps took $((sum / 1000)) s of CPU here ($cached served by ccache, counted at their last real time$([ "$unknown" -gt 0 ] && echo ", $unknown of them with none recorded: counted as served, so low; CCACHE_DISABLE=1 measures them"))"
    log "    wall ${t_build} s on ${ncores} cores here; there max(CPU time / 16 = $((sum / 16000)) s, longest chain = $((crit / 1000)) s: slowest object + libgalley link + slowest executable link)"
    log "  BatchNorm against cuDNN ~5 s (6 shapes x 6 ways x 600 calls of a few to tens of us, eager and replayed as graphs, and start-up)"
    log "  GPU tests ~${t_tests} s: $n tests x ~2 s each (process start, CUDA context, library handles; $jobs at a time), at most min($n x 90 s, what the budget leaves); galley-sees-the-GPU check ~5 s; reports ~10 s"
    estimate_json=$(printf '{"total_s": %s, "budget_s": %s, "prerequisites_s": 15, "configure_s": %s, "build_s": %s, "build_cpu_s_here": %s, "build_wall_s_here": %s, "cores_here": %s, "build_steps": %s, "ccache_steps": %s, "ccache_steps_unrecorded": %s, "build_chain_s": %s, "tests_s": %s, "tests": %s, "basis": %s}' \
      "$t_total" "$budget" "$t_conf" "$est_build" "$((sum / 1000))" "$t_build" "$ncores" "$steps" "$cached" "$unknown" "$((crit / 1000))" "$t_tests" "$n" \
      "$(js "build: CPU time of each build step here (ninja log; ccache hits at their last real time) over 16 cores, or the longest dependent chain if longer, same speed per core assumed; tests: 2 s each; configure as measured here")")
    if [ "$t_total" -gt "$budget" ]; then
      fail "the estimate (${t_total} s) is over the phase's budget (${budget} s): the real run would be cut short"
    fi
    finish_phase "$([ ${#errors[@]} -eq 0 ] && echo ok || echo failed)"
    [ ${#errors[@]} -eq 0 ]
    return
  fi

  # galley must see the GPU that nvidia-smi lists: a CUDA runtime newer than the driver makes it
  # see none, every GPU test then skips and the run would look green.
  local smoke
  step --log "$out/gpu-tests.log" "galley sees the GPU" 60 -- "$build/tests/test_cuda" --gtest_filter=Cuda.DeviceNameAndMemory
  smoke=$?
  if grep -q 'SKIPPED' "$out/gpu-tests.log"; then
    fail "galley sees no GPU although nvidia-smi lists one ($gpu_name, driver $driver); the GPU tests skip: $(grep -A1 -m1 ': Skipped$' "$out/gpu-tests.log" | tail -1 | head -c 200)"
  elif [ $smoke -ne 0 ]; then
    fail "test_cuda --gtest_filter=Cuda.DeviceNameAndMemory failed (gpu-tests.log)"
  fi

  batch_norm_bench

  local room stop
  room=$(($(left) - reserve))
  [ "$room" -gt 330 ] && room=330
  stop=$(date -d "@$(($(date +%s) + room - 15))" +%H:%M:%S)
  step --log "$out/gpu-tests.log" "GPU tests" "$room" -- "$ctest_bin" --test-dir "$build" -L gpu --timeout 90 \
    -j "$jobs" --output-on-failure --output-junit "$out/gpu-tests.xml" --stop-time "$stop"
  local trc=$?
  local line
  line=$(grep -E 'tests passed, [0-9]+ tests failed out of' "$out/gpu-tests.log" | tail -1)
  local total=0 failed=0 skipped=0
  if [[ $line =~ ([0-9]+)\ tests\ failed\ out\ of\ ([0-9]+) ]]; then
    failed=${BASH_REMATCH[1]} total=${BASH_REMATCH[2]}
  fi
  skipped=$(grep -c '(Skipped)' "$out/gpu-tests.log")
  [ "$skipped" -gt 0 ] && note "$skipped GPU test(s) skipped: $(grep '(Skipped)' "$out/gpu-tests.log" | sed 's/^[ \t]*[0-9]* - //; s/ (Skipped)//' | tr '\n' ' ' | head -c 400)"
  grep -q 'The stop time has been passed' "$out/gpu-tests.log" && fail "the GPU tests ran out of time; those not started are not in gpu-tests.xml"
  tests_json=$(printf '{"total": %s, "failed": %s, "skipped": %s, "summary": %s, "junit": "gpu-tests.xml"}' \
    "${total:-0}" "${failed:-0}" "${skipped:-0}" "$(js "$line")")
  log "GPU tests: ${line:-no summary (see gpu-tests.log)}"
  [ $trc -eq 0 ] || fail "GPU tests: ${line:-ctest exited with $trc}; failures in gpu-tests.log and gpu-tests.xml"
  finish_phase "$([ ${#errors[@]} -eq 0 ] && echo ok || echo failed)"
  [ ${#errors[@]} -eq 0 ]
}

run_bench() {
  begin_phase bench 420
  local work="$build/gpu-check/bench" jsonl="$out/galley-train-step-gpu.jsonl"
  rm -rf "$work"; mkdir -p "$work"
  rm -f "$out/bench-steps.log" "$jsonl" "$out/torch-train-step-gpu.json" "$out/gpu-train-step.md" "$out/gpu-train-step.json"
  steplog="$out/bench-steps.log"
  : > "$steplog"
  local t0
  t0=$(date +%s)
  prereqs
  write_json running
  if [ ${#errors[@]} -gt 0 ]; then
    log "not starting: $((${#errors[@]})) prerequisite(s) missing"
    finish_phase "prerequisites missing"
    return 1
  fi
  printf '{"date": %s, "commit": %s, "gpu": %s, "driver": %s, "cuda": %s, "cpu": %s}\n' \
    "$(js "$(date -u '+%Y-%m-%d %H:%M UTC')")" "$(js "$commit")" "$(js "$gpu_name")" "$(js "$driver")" \
    "$(js "$("$nvcc" --version 2> /dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')")" \
    "$(js "$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo 2> /dev/null | head -1), $ncores cores")" > "$work/meta.json"

  # The build of build-test when it is there (its binaries as they are: the copy of the tree that
  # travels may carry new timestamps, and a rebuild of everything would eat the phase).
  local bin=("$build/benchmarks/bench_train_step" "$build/examples/fashion_mnist" "$build/tools/launch/galley-launch") have=1 b
  for b in "${bin[@]}"; do [ -x "$b" ] || have=0; done
  if [ $have = 1 ] && [ -z "${GALLEY_GPU_CHECK_REBUILD:-}" ]; then
    log "reusing the build in $build"
  else
    log "building the benchmarks in $build"
    if [ ! -f "$build/CMakeCache.txt" ] || [ -n "${GALLEY_GPU_CHECK_REBUILD:-}" ]; then
      configure || { fail "configure failed (bench-steps.log)"; finish_phase failed; return 1; }
      cat "$out/configure.log" >> "$steplog"; rm -f "$out/configure.log"
    fi
    build_targets "$steplog" 300 "${bench_targets[@]}" || { fail "build failed (bench-steps.log)"; finish_phase failed; return 1; }
  fi

  # galley, eager and CUDA graph (resnet: BatchNorm and residual sums in the graph too).
  local model batch graph g r
  for model in simple fashion resnet; do
    for batch in 64 256; do
      for graph in "" --graph; do
        g=false; [ -n "$graph" ] && g=true
        step --dry-list --stdout "$jsonl" "galley $model batch $batch${graph:+ graph}" 60 -- \
          "${bin[0]}" --device cuda:0 --model "$model" --batch "$batch" --warmup 10 --iters 50 --repeats 5 --json $graph
        r=$?
        if [ $r -ne 0 ]; then
          printf '{"model": "%s", "batch": %s, "graph": %s, "error": "exit %s (bench-steps.log)"}\n' "$model" "$batch" "$g" "$r" >> "$jsonl"
        fi
      done
    done
  done

  # Mixed precision, eager: resnet at batch 256 under bfloat16 and float16 autocast (the goal:
  # bfloat16 >= 1.8x the float32 step above); shorter runs (3 blocks of 20 steps) to fit.
  local amp
  for amp in bf16 fp16; do
    step --dry-list --stdout "$jsonl" "galley resnet batch 256 amp $amp" 40 -- \
      "${bin[0]}" --device cuda:0 --model resnet --batch 256 --warmup 10 --iters 20 --repeats 3 --json --amp "$amp"
    r=$?
    if [ $r -ne 0 ]; then
      printf '{"model": "resnet", "batch": 256, "graph": false, "amp": "%s", "error": "exit %s (bench-steps.log)"}\n' "$amp" "$r" >> "$jsonl"
    fi
  done

  # PyTorch, eager then torch.compile (its own budget: it skips what would not fit).
  if [ "$torch_ok" = 1 ] || [ "$dry" = 1 ]; then
    local lim=240 room
    room=$(($(left) - reserve - 10))
    [ "$dry" = 0 ] && [ "$room" -lt "$lim" ] && lim=$room
    [ "$lim" -lt 30 ] && lim=30
    step --dry-list "PyTorch eager and torch.compile" "$lim" -- env PYTHONUNBUFFERED=1 "${py:-python3}" \
      benchmarks/gpu/torch_train_step_gpu.py --out "$out/torch-train-step-gpu.json" --budget-s $((lim - 20)) ||
      fail "the PyTorch reference failed (bench-steps.log)"
  else
    note "PyTorch runs skipped: no python3 with torch"
  fi

  # Two memory-capped jobs side by side under galley-launch.
  local job_a job_b
  if [ -n "$fashion" ]; then
    job_a="\"${bin[1]}\", \"--epochs\", \"1\", \"--seed\", \"1\", \"--device\", \"cuda:0\", \"--data\", \"$fashion\""
    job_b="\"${bin[1]}\", \"--epochs\", \"1\", \"--seed\", \"2\", \"--device\", \"cuda:0\", \"--data\", \"$fashion\""
  else
    job_a="\"${bin[0]}\", \"--device\", \"cuda:0\", \"--model\", \"fashion\", \"--batch\", \"256\", \"--iters\", \"100\", \"--repeats\", \"5\""
    job_b=$job_a
  fi
  cat > "$work/capped-jobs.toml" << TOML
# Two jobs on GPU 0, each capped at 0.4 of its memory (GALLEY_GPU_MEMORY_FRACTION): 0.4 + 0.4 <= 1,
# so galley-launch starts them together.
[[job]]
name = "capped-a"
command = [$job_a]
gpus = [0]
memory_fraction = 0.4
[[job]]
name = "capped-b"
command = [$job_b]
gpus = [0]
memory_fraction = 0.4
TOML
  step --dry-list "two capped jobs side by side" 150 -- "${bin[2]}" --log-dir "$work/capped" \
    --status-table off "$work/capped-jobs.toml" || fail "the capped jobs did not both succeed (bench-steps.log)"
  if [ -d "$work/capped" ]; then
    cp "$work/capped/summary.json" "$work/capped-summary.json" 2> /dev/null
    for b in "$work"/capped/*.log; do
      [ -f "$b" ] && { printf '\n### %s\n' "$(basename "$b")"; cat "$b"; } >> "$steplog"
    done
  fi
  if [ "$dry" = 1 ]; then
    log "  jobs: $(tr '\n' ' ' < "$work/capped-jobs.toml" | sed 's/#[^[]*//')"
    # The job file as galley-launch reads it, on a made-up H200.
    step "capped jobs' file, checked by galley-launch" 30 -- "${bin[2]}" --check --gpus-available 0 \
      --gpu-memory-mb 143771 "$work/capped-jobs.toml" ||
      fail "galley-launch rejects the capped jobs' file (bench-steps.log)"
  fi

  # The Fashion-MNIST example beside PyTorch's same recipe, 2 epochs each.
  if [ -n "$fashion" ]; then
    step --dry-list --stdout "$work/fashion-gpu.log" "Fashion-MNIST example, 2 epochs" 120 -- \
      "${bin[1]}" --epochs 2 --data "$fashion" --device cuda:0
    [ -f "$work/fashion-gpu.log" ] && cat "$work/fashion-gpu.log" >> "$steplog"
    if [ "$torch_ok" = 1 ] || [ "$dry" = 1 ]; then
      step --dry-list --stdout "$work/torch-fashion-gpu.json" "PyTorch Fashion-MNIST, 2 epochs" 120 -- \
        "${py:-python3}" benchmarks/time_to_accuracy_torch.py --data "$fashion" --device cuda --epochs 2 \
        --target 2 --eval-every 1000000 --json
    fi
  fi

  # Independent jobs packed onto the GPU: 2 and 4 copies of the small models, serial against
  # side by side (memory-capped), with the GPU's utilisation for each.
  if [ -n "$fashion" ]; then
    step --dry-list "packing 2 and 4 jobs on one GPU" 100 -- "${py:-python3}" benchmarks/run_packing.py \
      --build "$build" --device cuda:0 --jobs 2,4 --models fashion --limit 10000 --data "$fashion" \
      --out "$work/packing-gpu.json"
  fi

  # The table.
  if [ "$dry" = 1 ]; then
    # summarize.py on made-up figures, so that a change to its inputs is caught here.
    local fx="$work/fixture"
    mkdir -p "$fx"
    for model in simple fashion resnet; do for batch in 64 256; do for g in false true; do
      printf '{"impl": "galley", "model": "%s", "batch": %s, "device": "cuda:0", "graph": %s, "samples_per_s": 1000.0, "amp": "off"}\n' "$model" "$batch" "$g"
    done; done; done > "$fx/galley-train-step-gpu.jsonl"
    printf '{"impl": "galley", "model": "resnet", "batch": 256, "device": "cuda:0", "graph": false, "samples_per_s": 2000.0, "amp": "bf16"}\n' >> "$fx/galley-train-step-gpu.jsonl"
    printf '{"torch": "2.x", "gpu": "a GPU", "cudnn_benchmark": true, "runs": [{"model": "simple", "batch": 64, "mode": "eager", "samples_per_s": 500.0}, {"model": "simple", "batch": 64, "mode": "compile", "error": "made up"}]}\n' > "$fx/torch-train-step-gpu.json"
    if step "summarize.py on sample figures" 30 -- python3 benchmarks/gpu/summarize.py "$fx" --meta "$work/meta.json" &&
      grep -q '| simple | 64 | 1,000 | 1,000 | 500 | - | 2.00x | - |' "$fx/gpu-train-step.md" &&
      grep -q '| resnet | 256 | 1,000 | 2,000 | - | - | - | 2.00x | - |' "$fx/gpu-train-step.md"; then :; else
      fail "benchmarks/gpu/summarize.py does not turn sample figures into the table (bench-steps.log)"
    fi
    log "would run (limit 30 s): ${py:-python3} benchmarks/gpu/summarize.py $out --work $work --meta $work/meta.json"
    local n_g=8 n_amp=2 t_expected upper
    t_expected=$((15 + n_g * 6 + n_amp * 3 + 160 + 40 + 40 + 45 + 50 + 5 + 10))
    upper=$((15 + n_g * 60 + n_amp * 40 + 240 + 150 + 120 + 120 + 100 + 30))
    log "estimate for bench on the GPU machine: about ${t_expected} s of its ${budget} s budget (with the build of build-test; building anew adds build-test's build time)"
    log "  prerequisites ~15 s; galley: 8 runs x ~6 s (start-up, cuDNN's algorithm search, 260 steps of a few ms) and 2 autocast runs x ~3 s (70 steps); PyTorch: ~160 s (6 eager runs of a few s, 2 of them under autocast, 4 torch.compile runs of ~30 s of compiling each)"
    log "  capped jobs ~40 s, Fashion-MNIST ~40 s galley + ~45 s PyTorch, packing ~50 s (2 + 4 jobs x 3 ways of a 10000-image epoch of a few s), summary ~5 s, reports ~10 s"
    log "  these are expectations, not measurements: the limits above add up to ${upper} s, and each is cut to what is left of the budget, the runs in order of importance (galley, PyTorch, capped jobs, Fashion-MNIST, packing)"
    estimate_json=$(printf '{"total_s": %s, "budget_s": %s, "sum_of_limits_s": %s, "basis": %s}' "$t_expected" "$budget" "$upper" \
      "$(js "expected run times (not measured here): galley 8 x 6 s + 2 x 3 s, PyTorch 160 s, capped jobs 40 s, Fashion-MNIST 85 s, packing 50 s; every limit is cut to the budget left")")
    [ "$t_expected" -gt "$budget" ] && fail "the estimate (${t_expected} s) is over the phase's budget (${budget} s)"
    finish_phase "$([ ${#errors[@]} -eq 0 ] && echo ok || echo failed)"
    [ ${#errors[@]} -eq 0 ]
    return
  fi
  if [ -n "$py" ]; then
    step "summary" 30 -- "$py" benchmarks/gpu/summarize.py "$out" --work "$work" --meta "$work/meta.json" ||
      fail "summarize.py failed (bench-steps.log)"
    [ -f "$out/gpu-train-step.md" ] && tee -a "$mainlog" < "$out/gpu-train-step.md"
  fi
  # A galley run that failed, or a PyTorch run missing, is an error of the phase.
  grep -q '"error"' "$jsonl" 2> /dev/null && fail "some galley runs failed (galley-train-step-gpu.jsonl, bench-steps.log)"
  [ -s "$jsonl" ] || fail "no galley figures"
  finish_phase "$([ ${#errors[@]} -eq 0 ] && echo ok || echo failed)"
  [ ${#errors[@]} -eq 0 ]
}

case "$phase" in
  build-test) run_build_test; rc=$? ;;
  bench) run_bench; rc=$? ;;
  all)
    run_build_test; rc=$?
    if [ $rc -eq 0 ]; then run_bench; rc=$?; fi
    echo "[gpu-check] dry run of both phases: $([ $rc -eq 0 ] && echo passed || echo FAILED) in $(($(date +%s) - t_start)) s; logs in $out"
    ;;
esac
cur=""
exit $rc
