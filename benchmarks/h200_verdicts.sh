#!/bin/bash
# Run-level verdicts on one H200 (issue 7): record resnet50 ddp ws1 cases with 3 runs each, then
# identical sessions and sessions with a device-side slowdown (faults.py "slow": a GPU spin of
# MS milliseconds queued after every step). Usage: benchmarks/h200_verdicts.sh PHASE OUTDIR
#   record | quiet N | slow N   (slow: bf16 strong +2.8 ms, fp32 strong +4.1 ms: about 5 %)
set -u
phase=$1; out=$2; n=${3:-1}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
sel=(--perf-models resnet50 --perf-modes ddp --perf-world-sizes 1 --perf-inputs synthetic
     --perf-baselines "$out/B" -p no:cacheprovider -q -rN)
mkdir -p "$out/B"
case $phase in
  record) python -m pytest perf/test_train_step.py "${sel[@]}" --perf-update-baselines --perf-repeats 3 \
            --benchmark-save=record --benchmark-storage="file://$out/bench" ;;
  quiet) for i in $(seq 1 "$n"); do
           python -m pytest perf/test_train_step.py "${sel[@]}" --benchmark-save="quiet$i" \
             --benchmark-storage="file://$out/bench"; echo "quiet $i rc=$?"; done ;;
  slow) for i in $(seq 1 "$n"); do
          SCALEGUARD_INJECT_FAULT=slow,ms=2.8 python -m pytest perf/test_train_step.py "${sel[@]}" -k "bf16 and strong" --perf-inject-faults
          echo "slow bf16 $i rc=$?"
          SCALEGUARD_INJECT_FAULT=slow,ms=4.1 python -m pytest perf/test_train_step.py "${sel[@]}" -k "fp32 and strong" --perf-inject-faults
          echo "slow fp32 $i rc=$?"; done ;;
esac
