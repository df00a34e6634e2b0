#!/bin/bash
# Harness speed and fidelity on one H200 (issue 8). Usage: benchmarks/h200_speed.sh PHASE OUTDIR
#   pair: the resnet50 ws1 synthetic cases, isolated then pooled (benchmarks/harness_speed.py,
#         --perf-confirm 0), then the hand-written loop against the pooled session's JSON
#   full: the README's main command with the default (full) profile, pooled, timed
# Page cache is warmed first (import torch, torchvision) so the first session is not the only
# one paying a cold disk.
set -u
phase=$1; out=$2
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$out"
python -c "import torch, torchvision; torch.zeros(1, device='cuda')"
case $phase in
  pair)
    python benchmarks/harness_speed.py --pairs 1 --out "$out/speed" -- \
      --perf-models resnet50 --perf-world-sizes 1 --perf-inputs synthetic -p no:cacheprovider
    python benchmarks/handwritten_resnet50.py --suite-json "$out/speed/pooled0.json" ;;
  full)
    # the profiler's residue first (benchmarks/profiler_residue.py), with the worker's setting
    TEARDOWN_CUPTI=1 python benchmarks/profiler_residue.py --precision bf16 2>&1 | grep -v -i warn
    start=$(date +%s)
    # SIGINT at the limit: pytest stops, and the plugin closes its pools and writes what it has
    timeout -s INT "${LIMIT:-540}" python -m pytest perf/ -v -p no:cacheprovider --benchmark-save=full \
      --benchmark-storage="file://$out/bench" --benchmark-json="$out/full.json" -rN 2>&1 \
      | while IFS= read -r line; do echo "$(( $(date +%s) - start )) $line"; done > "$out/full.log"
    grep -E "PASSED|FAILED|ERROR|scaleguard:|passed|failed" "$out/full.log" | cut -c1-150 | tail -90
    echo "full session: $(( $(date +%s) - start )) s" ;;
esac
