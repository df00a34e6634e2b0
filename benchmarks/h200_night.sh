#!/bin/bash
# The one-H200 night (issues 18 and 19). Usage: benchmarks/h200_night.sh PHASE OUTDIR
#   record-decoder  tests/gpu; the decoder's default cases recorded into the committed baseline
#                   (README recipe, 2 runs each)
#   explain         injected device- and host-side delays of known size against a same-machine
#                   baseline with anatomy (item 5); the bimodal host-bound case, default vs pinned
#   judge           the README's main command, as a user runs it, timed, full log
#   record-one      one more run of the cases named by -k "$CASES" into the committed baseline
# Every log goes to OUTDIR; each step has its own deadline so one call never runs past its slot.
set -u
phase=$1; out=$2
. "$(dirname "$0")/h200_common.sh"
case $phase in
  record-decoder)
    gpu_tests 300
    timeout -s INT 270 python -m pytest perf/ -k gpt2_small -v -rfE --perf-update-baselines --perf-repeats 2 \
      --benchmark-save=decoder --benchmark-storage="file://$out/bench" --benchmark-json="$out/decoder.json" \
      2>&1 | stamp > "$out/record-decoder.log"
    grep -E "PASSED|FAILED|ERROR|scaleguard|passed|failed|NEW|REGRESSED" "$out/record-decoder.log" | cut -c1-220 | tail -40
    cp baselines/cuda-nvidia-h200-x1.json "$out/" ;;
  explain)
    # item 5: injected device- and host-side delays of known size against a same-machine baseline
    # with anatomy, then the bimodal host-launch-bound case under default and pinned placement.
    # Log names carry no ',' or '=' (the device tool does not return such names).
    base=$(mktemp -d); cp baselines/*.json "$base/" 2>/dev/null; rm -f "$base"/cuda-nvidia-h200-x1.json
    sel='resnet50-ddp-ws1-bf16-strong or resnet50-ddp-ws1-bf16-weak'
    common=(perf/ -k "$sel and not loader" --perf-inputs synthetic --perf-baselines "$base" --perf-no-history -rfE)
    timeout -s INT "${RECORD_LIMIT:-200}" python -m pytest "${common[@]}" --perf-update-baselines --perf-repeats 2 2>&1 | stamp > "$out/explain-record.log"
    tail -3 "$out/explain-record.log"
    i=0
    faults=("slow,ms=2.8,at=backward" "slow,ms=12,at=backward,on=host")
    if [ -n "${FAULTS:-}" ]; then read -r -a faults <<< "$FAULTS"; fi  # e.g. FAULTS="slow,ms=12,at=backward,on=host"
    # FAULT_CASES: one case id per fault (space-separated), to judge each fault on one case only
    cases=(); if [ -n "${FAULT_CASES:-}" ]; then read -r -a cases <<< "$FAULT_CASES"; fi
    for fault in "${faults[@]}"; do
      i=$((i+1))
      args=("${common[@]}")
      if [ -n "${cases[$((i-1))]:-}" ]; then args=(perf/ -k "${cases[$((i-1))]} and not loader" --perf-inputs synthetic --perf-baselines "$base" --perf-no-history -rfE); fi
      SCALEGUARD_INJECT_FAULT=$fault timeout -s INT "${FAULT_LIMIT:-150}" python -m pytest "${args[@]}" 2>&1 | stamp > "$out/explain-fault$i.log"
      echo "== $fault"; grep -E "REGRESSED|OK|IMPROVED|slower|phases|op" "$out/explain-fault$i.log" | grep -v "PASSED" | cut -c1-500 | head -12
    done
    # the bimodal host-launch-bound case: default placement, then the rank pinned to 8 cores
    for i in $(seq 1 "${BIMODAL_RUNS:-2}"); do
      timeout -s INT 45 python -m pytest perf/ -k "resnet50-ddp-ws1-bf16-weak and not loader" --perf-no-history -q \
        --perf-baselines "$base" --benchmark-json="$out/weak-default-$i.json" > "$out/weak-default-$i.log" 2>&1
      timeout -s INT 45 taskset -c 0-7 python -m pytest perf/ -k "resnet50-ddp-ws1-bf16-weak and not loader" \
        --perf-baselines "$base" --perf-threads-per-rank 8 --perf-no-history -q --benchmark-json="$out/weak-pinned-$i.json" > "$out/weak-pinned-$i.log" 2>&1
    done
    grep -h "resnet50-ddp-ws1-bf16-weak " "$out"/weak-*.log | cut -c1-200 ;;
  judge)
    start=$(date +%s)
    timeout -s INT "${LIMIT:-590}" python -m pytest perf/ -v -rfE --benchmark-save=nightly \
      --benchmark-storage="file://$out/bench" --benchmark-json="$out/nightly.json" 2>&1 | stamp > "$out/judge.log"
    echo "judge session: $(( $(date +%s) - start )) s"
    grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$out/judge.log" | cut -c1-160 | tail -50 ;;
  record-one)
    timeout -s INT "${LIMIT:-200}" python -m pytest perf/ -k "$CASES" -v -rfE --perf-update-baselines \
      2>&1 | stamp > "$out/record-one.log"
    tail -5 "$out/record-one.log"; cp baselines/cuda-nvidia-h200-x1.json "$out/" ;;
esac
