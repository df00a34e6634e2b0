#!/bin/bash
# Issue 40 on one GPU of any kind (H100, H200): the kind's baseline recorded with GPU busy time,
# the night judged, what a 1 % threshold resolves. Usage: benchmarks/gpu_evidence.sh PHASE OUTDIR
#   record SELECTION REPEATS  runs of the default cases matching -k SELECTION ("all": every one)
#                             appended to the baseline of this machine's key, one pytest session
#                             per SELECTION word group so a limit loses one group at most
#                             (LIMIT1, LIMIT2 ... each group's deadline; STRIP=1 first drops
#                             runs without GPU busy time)
#   spread                    benchmarks/kind_spread.py on this machine's baseline; with
#                             PATCH=1 the figure goes into src/scaleguard/devices.py's KIND_SPREADS
#                             here (the resolve phase then assumes it); printed either way
#   judge                     the README's main command, as a user runs it, timed, full log
#   resolve [FAULT...]        --perf-threshold-step 0.01 on the device-bound cases (GPU busy
#                             >= 90 % of the step in the baseline's runs: `cases` below), one
#                             session per FAULT (none: A/A; slow,pct=P: a GPU spin of P % of each
#                             step's own device time), against BASE (a baseline folder; default the
#                             committed one). A/A gets FAULT_LIMIT (150 s), a slowdown SLOW_LIMIT
#                             (300 s: caught cases buy confirm runs); SEL=-k expression narrows
#                             the cases
# The baseline file is this machine's (`scaleguard hardware-key`): an H100 lent for an H200 call
# records and judges its own file, never the H200's.
# Every step has its own deadline (LIMIT) so one call never runs past its slot; logs go to OUTDIR.
set -u
phase=$1; out=$2
. "$(dirname "$0")/h200_common.sh"
key=$(python -m scaleguard.cli hardware-key)
base=baselines/$key.json
echo "baseline file: $base"
case $phase in
  record)
    sel=$3; repeats=$4
    if [ "${STRIP:-0}" = 1 ] && [ -f "$base" ]; then
      # through the suite's own reader and atomic writer: the file is checked on the way in and out
      python - "$base" <<'PY'
import sys
from dataclasses import replace
from pathlib import Path
from scaleguard.evidence import baseline
from scaleguard.evidence.files import atomic_write_text
path = Path(sys.argv[1])
loaded = baseline.load(path)
cases, dropped = {}, 0
for cid, by_torch in loaded.cases.items():
    for tv, entry in by_torch.items():
        keep = [r for r in entry.runs if r.anatomy is not None and r.anatomy.device_busy_ms is not None]
        dropped += len(entry.runs) - len(keep)
        if keep:
            cases.setdefault(cid, {})[tv] = entry.with_runs(keep)
atomic_write_text(path, replace(loaded, cases=cases).to_text())
print(f"stripped {dropped} runs without GPU busy time; {len(cases)} cases left")
PY
    fi
    if [ "$sel" = all ]; then groups=("resnet50" "not resnet50"); else groups=("$sel"); fi
    n=0
    for group in "${groups[@]}"; do
      n=$((n + 1)); start=$(date +%s)
      lim=LIMIT$n; timeout -s INT "${!lim:-${LIMIT:-560}}" python -m pytest perf/test_train_step.py -k "$group" -v -rfE \
        --perf-update-baselines --perf-repeats "$repeats" --perf-no-history \
        --benchmark-json="$out/record$n.json" 2>&1 | stamp > "$out/record$n.log"
      echo "record session $n ($group): $(( $(date +%s) - start )) s"
      grep -E "machine probe|FAILED|ERROR|passed|failed|baseline" "$out/record$n.log" | cut -c1-220 | tail -8
    done
    cp "$base" "$out/" ;;
  spread)
    python benchmarks/kind_spread.py "$base" | tee "$out/spread.txt"
    if [ "${PATCH:-0}" = 1 ]; then
      python - "$out/spread.txt" <<'PY'
import re, sys
import torch
text = open(sys.argv[1]).read()
upper = float(re.search(r"90 % upper bound ([0-9.]+)", text).group(1))
name = torch.cuda.get_device_name()
path = "src/scaleguard/devices.py"
src = open(path).read()
entry = f'    {name!r}: KindSpread({upper:.4f}, "measured in this call (benchmarks/gpu_evidence.sh spread)"),\n'
src = src.replace("KIND_SPREADS: dict[str, KindSpread] = {\n", "KIND_SPREADS: dict[str, KindSpread] = {\n" + entry, 1)
open(path, "w").write(src)
print(f"KIND_SPREADS[{name!r}] = {upper:.4f} for this call")
PY
    fi ;;
  judge)
    start=$(date +%s)
    timeout -s INT "${LIMIT:-400}" python -m pytest perf/ -v -rfE --benchmark-save=nightly \
      --benchmark-storage="file://$out/bench" --benchmark-json="$out/nightly.json" --perf-no-history \
      2>&1 | stamp > "$out/judge.log"
    echo "judge session: $(( $(date +%s) - start )) s"
    grep -E "machine probe|FAILED|ERROR|SKIPPED|passed|failed" "$out/judge.log" | cut -c1-160 | tail -12
    grep -E "^[0-9]+ +(OK|REGRESSED|NEW|INCONCLUSIVE|IMPROVED|NOISY)|verdicts?:" "$out/judge.log" | head -5 ;;
  resolve)
    shift 2
    faults=("$@"); [ ${#faults[@]} -eq 0 ] && faults=(none "slow,pct=1.5")
    judged=${BASE:-baselines}
    # the verdict's own rule, or SEL (a -k expression: the cases a limited call has left to judge)
    sel=${SEL:-$(python benchmarks/kind_spread.py "$judged/$key.json" --cases)}
    echo "device-bound cases: $sel"
    n=0
    for fault in "${faults[@]}"; do
      n=$((n + 1)); tag=$n-${fault//[,=.]/_}
      start=$(date +%s)
      if [ "$fault" = none ]; then unset SCALEGUARD_INJECT_FAULT; limit=${FAULT_LIMIT:-150}
      else export SCALEGUARD_INJECT_FAULT=$fault; limit=${SLOW_LIMIT:-300}; fi
      timeout -s INT "$limit" python -m pytest perf/test_train_step.py -k "$sel" -v -rfE \
        --perf-threshold-step 0.01 --perf-no-history --perf-baselines "$judged" \
        --benchmark-json="$out/resolve-$tag.json" 2>&1 | stamp > "$out/resolve-$tag.log"
      echo "== $fault: $(( $(date +%s) - start )) s"
      grep -E "REGRESSED|OK|IMPROVED|INCONCLUSIVE|NOISY|NEW" "$out/resolve-$tag.log" | grep -v PASSED | cut -c1-200 | head -14
    done
    unset SCALEGUARD_INJECT_FAULT ;;
esac
