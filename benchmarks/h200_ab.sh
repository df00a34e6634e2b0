#!/bin/bash
# Paired A/B and foreign GPU load on one H200 (issues 11, 12). Usage: benchmarks/h200_ab.sh PHASE OUTDIR
#   same    A and B the same install (torch of the machine), resnet50 ddp ws1 bf16/fp32 strong
#   slow    B with a device-side spin of 2.8 ms per step (about 5 % of bf16 strong) in B's ranks only
#   hog     the committed baseline's bf16 strong case while another process runs matmuls on the GPU
#   anatomy record bf16 strong (2 runs), then a session with 5 ms of GPU spin inside backward:
#           the REGRESSED story should name backward; the kept trace must be Chrome-trace JSON
set -u
phase=$1; out=$2
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
py=$(command -v python)
sel=(--perf-models resnet50 --perf-modes ddp --perf-world-sizes 1 --perf-inputs synthetic -p no:cacheprovider)
mkdir -p "$out"
case $phase in
  same) scaleguard ab --a "$py" --b "$py" --markdown "$out/same.md" --plot "$out/same.png" --save-dir "$out/same" \
          perf/test_train_step.py "${sel[@]}" -k "strong" ;;
  slow) scaleguard ab --a "$py" --b "$py" --b-env SCALEGUARD_INJECT_FAULT=slow,ms=2.8 --markdown "$out/slow.md" \
          --plot "$out/slow.png" perf/test_train_step.py "${sel[@]}" -k "bf16 and strong" --perf-inject-faults ;;
  hog) python - <<'PY' &
import time, torch
a = torch.randn(8192, 8192, device="cuda")
deadline = time.monotonic() + 540  # bounded: never outlives the call
while time.monotonic() < deadline:
    a = (a @ a).clamp_(-1, 1)
PY
       hog=$!; sleep 10
       python -m pytest perf/test_train_step.py "${sel[@]}" -k "bf16 and strong" -rN; echo "hog session rc=$?"
       kill $hog; wait $hog 2>/dev/null ;;
  anatomy) python -m pytest perf/test_train_step.py "${sel[@]}" -k "bf16 and strong" --perf-baselines "$out/B" \
             --perf-update-baselines --perf-repeats 2 -q; echo "record rc=$?"
           SCALEGUARD_INJECT_FAULT=slow,ms=5,at=backward python -m pytest perf/test_train_step.py "${sel[@]}" \
             -k "bf16 and strong" --perf-baselines "$out/B" --perf-trace-dir "$out/traces" -q -rN \
             --perf-inject-faults; echo "slow rc=$?"
           python -c "import json, glob, sys; [print(p, len(json.load(open(p))['traceEvents']), 'events') for p in glob.glob(sys.argv[1] + '/traces/*.json')]" "$out" ;;
esac
