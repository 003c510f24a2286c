#!/usr/bin/env bash
# Every GPU test and benchmark, on a machine with NVIDIA GPUs (none of this
# runs in this repository's CI, which has nvcc but no GPU):
#   1. builds the CUDA parts (-DMEGASCOPE_CUDA=ON) in BUILD_DIR (default build-gpu);
#   2. kernels_gpu_tests: the CUDA kernels against their CPU twins;
#   3. exec_gpu_tests: cuBLASLt GEMMs against the CPU twins, NCCL on one GPU, the
#      event timer, the replay, --train against the cpu backend; then again under
#      mpirun with one rank per GPU (NCCL against MPI, --train with TP, PP, DP);
#   4. exec_cuda_tests: the no-device error paths (pass vacuously on a GPU machine);
#   5. kernels_bench: GB/s of the memory-bound kernels and attention TFLOP/s (JSON kept);
#   6. megascope calibrate --backend cuda (under mpirun over all GPUs when there
#      are several), writing BUILD_DIR/gpu-check/<gpu>-measured-<date>.toml (copy it
#      to topologies/calibrations/ to ship it; the CPU tests check every file there);
#   7. megascope run --backend cuda: a one-GPU plan (gpt-1.7b) simulated with that
#      profile and replayed, then `megascope compare` of the two traces; and one
#      rank of a 32-GPU llama3-8b plan measured shard by shard.
# The machine needs what scripts/install-deps.sh installs (MPI, toml++, Catch2, ...)
# besides the CUDA toolkit and driver.
# Usage: scripts/gpu-check.sh [BUILD_DIR]
# Environment: GPUS=N (default: every GPU nvidia-smi lists), QUICK=1 (calibrate --quick),
#   CUDA_ARCHS="90" (default: CMake's 80;90 from cmake/Optional.cmake).
# Stops at the first failure; the logs are in BUILD_DIR/gpu-check/.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
day=$(date +%F)
outdir=$build/gpu-check
gpus=${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)}
if [ "${gpus:-0}" -lt 1 ]; then
  echo "gpu-check: no GPU listed by nvidia-smi (set GPUS=N to override)" >&2
  exit 1
fi
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
# "NVIDIA H100 80GB HBM3" -> h100
short=$(echo "$name" | grep -oiE '(gb200|b200|h200|h100|a100|l40s|l4)' | head -1 | tr '[:upper:]' '[:lower:]')
short=${short:-gpu}
mpirun_flags=()
[ "$(id -u)" = 0 ] && mpirun_flags+=(--allow-run-as-root)

cmake_args=(-S . -B "$build" -G Ninja -DMEGASCOPE_CUDA=ON -DMEGASCOPE_QT=OFF -DCMAKE_BUILD_TYPE=Release)
[ -n "${CUDA_ARCHS:-}" ] && cmake_args+=("-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS")
cmake "${cmake_args[@]}"
cmake --build "$build" -j"$(nproc)" --target kernels_gpu_tests exec_gpu_tests exec_cuda_tests kernels_bench megascope
mkdir -p "$outdir"

step() { echo; echo "== gpu-check: $* =="; }
# A test binary that exits 77 found no device: that is a failure here.
run_test() {
  local rc=0
  "$@" || rc=$?
  if [ "$rc" = 77 ]; then echo "gpu-check: $1 found no CUDA device" >&2; exit 1; fi
  return "$rc"
}

step "$gpus x $name"
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$outdir/nvidia-smi.csv"
step "kernels_gpu_tests"
run_test "$build/tests/kernels_gpu_tests" 2>&1 | tee "$outdir/kernels_gpu_tests.log"
step "exec_gpu_tests (one GPU)"
run_test "$build/tests/exec_gpu_tests" 2>&1 | tee "$outdir/exec_gpu_tests.log"
if [ "$gpus" -ge 2 ]; then
  step "exec_gpu_tests under mpirun -np $gpus (NCCL against MPI)"
  mpirun "${mpirun_flags[@]}" -np "$gpus" "$build/tests/exec_gpu_tests" 2>&1 | tee "$outdir/exec_gpu_tests-mpi.log"
fi
step "exec_cuda_tests"
"$build/tests/exec_cuda_tests" 2>&1 | tee "$outdir/exec_cuda_tests.log"
step "kernels_bench"
"$build/bench/kernels_bench" --json "$outdir/kernels_bench.json" 2>&1 | tee "$outdir/kernels_bench.log"
step "megascope calibrate --backend cuda"
profile=$outdir/$short-measured-$day.toml
# The default models' shapes, and gpt-1.7b's, which the one-GPU replay below runs.
calibrate=("$build/apps/megascope" calibrate --backend cuda -o "$profile"
           --cluster-output "$outdir/$short-measured-$day-cluster.toml")
if [ "${QUICK:-0}" = 1 ]; then
  calibrate+=(--quick --models gpt-1.7b)
else
  calibrate+=(--models llama3-8b,llama3-70b,gpt3-175b,gpt-1.7b --tp 1,2,4,8 --micro-batches 1,2)
fi
if [ "$gpus" -ge 2 ]; then
  mpirun "${mpirun_flags[@]}" -np "$gpus" "${calibrate[@]}" 2>&1 | tee "$outdir/calibrate.log"
else
  "${calibrate[@]}" 2>&1 | tee "$outdir/calibrate.log"
fi
# The shipped cluster of this GPU, else the one calibrate just wrote.
cluster=${CLUSTER:-dgx-$short}
[ -f "topologies/clusters/$cluster.toml" ] || cluster=${CLUSTER:-$outdir/$short-measured-$day-cluster.toml}
one_gpu=(--model gpt-1.7b --cluster "$cluster" --gpus 1 --plan tp=1,mbs=1 --global-batch 8)
step "megascope simulate vs run --backend cuda (${one_gpu[*]})"
"$build/apps/megascope" simulate "${one_gpu[@]}" --calibration "$profile" --trace "$outdir/replay-simulated.json" \
  2>&1 | tee "$outdir/replay-simulate.log"
"$build/apps/megascope" run --backend cuda "${one_gpu[@]}" --steps 5 --trace "$outdir/replay-measured.json" \
  2>&1 | tee "$outdir/replay-run.log"
"$build/apps/megascope" compare "$outdir/replay-simulated.json" "$outdir/replay-measured.json" \
  2>&1 | tee "$outdir/replay-compare.log"
step "megascope run --backend cuda --shard 0 (llama3-8b, tp=8,pp=4 on 32 GPUs)"
"$build/apps/megascope" run --backend cuda --model llama3-8b --cluster "$cluster" --gpus 32 --plan tp=8,pp=4,sp=on \
  --global-batch 16 --shard 0 --steps 2 2>&1 | tee "$outdir/replay-shard.log"
step "done: profile $profile, logs in $outdir"
