#!/bin/bash
# Issue 32 on one H200: the baseline re-recorded with GPU busy time, the night judged, and what a
# 1 % threshold resolves. Usage: benchmarks/h200_evidence.sh PHASE OUTDIR
#   record SELECTION REPEATS  runs of the default cases matching -k SELECTION appended to the
#                             committed baseline (STRIP=1 first drops runs that carry no GPU busy
#                             time: every run of the file must have it)
#   judge                     the README's main command, as a user runs it, timed, full log
#   resolve [FAULT...]        --perf-threshold-step 0.01 on the steady bs-256 cases, one session per
#                             FAULT (default: none slow,pct=1.5 slow,pct=3): an A/A session, then
#                             device-side slowdowns (SCALEGUARD_INJECT_FAULT slow,pct=P: a GPU spin of
#                             P % of each step's own device time); A/A gets FAULT_LIMIT (100 s), a
#                             slowdown SLOW_LIMIT (230 s: caught cases buy confirm runs)
# The baseline file is this machine's (`scaleguard hardware-key`): an H100 lent for an H200 call
# records and judges its own file, never the H200's.
# Every step has its own deadline (LIMIT) so one call never runs past its slot; logs go to OUTDIR.
set -u
phase=$1; out=$2
. "$(dirname "$0")/h200_common.sh"
base=baselines/$(python -m scaleguard.cli hardware-key).json
echo "baseline file: $base"
steady='resnet50- and strong and not cifar and not loader'
case $phase in
  record)
    sel=$3; repeats=$4
    if [ "${STRIP:-0}" = 1 ]; then
      python - "$base" <<'EOF'
import json, sys
path = sys.argv[1]
data = json.load(open(path))
dropped = 0
for cid, by_torch in list(data["cases"].items()):
    for tv, entry in list(by_torch.items()):
        keep = [r for r in entry["runs"] if (r.get("anatomy") or {}).get("device_busy_ms")]
        dropped += len(entry["runs"]) - len(keep)
        if keep:
            entry["runs"] = keep
        else:
            del by_torch[tv]
    if not by_torch:
        del data["cases"][cid]
json.dump(data, open(path, "w"), indent=2, sort_keys=True)
print(f"stripped {dropped} runs without GPU busy time; {len(data['cases'])} cases left")
EOF
    fi
    start=$(date +%s)
    timeout -s INT "${LIMIT:-560}" python -m pytest perf/test_train_step.py -k "$sel" -v -rfE \
      --perf-update-baselines --perf-repeats "$repeats" --perf-no-history \
      --benchmark-json="$out/record.json" 2>&1 | stamp > "$out/record.log"
    echo "record session: $(( $(date +%s) - start )) s"
    grep -E "machine probe|PASSED|FAILED|ERROR|passed|failed|baseline" "$out/record.log" | cut -c1-220 | tail -40
    cp "$base" "$out/" ;;
  judge)
    start=$(date +%s)
    timeout -s INT "${LIMIT:-400}" python -m pytest perf/ -v -rfE --benchmark-save=nightly \
      --benchmark-storage="file://$out/bench" --benchmark-json="$out/nightly.json" --perf-no-history \
      2>&1 | stamp > "$out/judge.log"
    echo "judge session: $(( $(date +%s) - start )) s"
    grep -E "machine probe|PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$out/judge.log" | cut -c1-160 | tail -32 ;;
  resolve)
    shift 2
    faults=("$@"); [ ${#faults[@]} -eq 0 ] && faults=(none "slow,pct=1.5" "slow,pct=3")
    n=0
    for fault in "${faults[@]}"; do
      n=$((n + 1)); tag=$n-${fault//[,=.]/_}
      start=$(date +%s)
      if [ "$fault" = none ]; then unset SCALEGUARD_INJECT_FAULT; limit=${FAULT_LIMIT:-100}
      else export SCALEGUARD_INJECT_FAULT=$fault; limit=${SLOW_LIMIT:-230}; fi
      timeout -s INT "$limit" python -m pytest perf/test_train_step.py -k "$steady" -v -rfE \
        --perf-threshold-step 0.01 --perf-no-history 2>&1 | stamp > "$out/resolve-$tag.log"
      echo "== $fault: $(( $(date +%s) - start )) s"
      grep -E "REGRESSED|OK|IMPROVED|INCONCLUSIVE|confirm" "$out/resolve-$tag.log" | grep -v PASSED | cut -c1-260 | head -12
    done
    unset SCALEGUARD_INJECT_FAULT ;;
esac
