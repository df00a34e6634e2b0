#!/bin/bash
# One lent-GPU call of issue 40: the plan for the kind that actually came (an `nvidia-h200` call
# may get an H100). Usage: [SEL=-k expression] benchmarks/gpu_call.sh H200_PLAN H100_PLAN OUTDIR
# Plans (every step has its own deadline; a step is skipped when the call's 570 s cannot hold it):
#   first   the README's main command first on the fresh machine (item 5), then the decoder and
#           transformer cases re-recorded with GPU busy time (their older runs dropped), then the
#           CIFAR and loader cases' second machine
#   second  the decoder and transformer cases' second machine, tests/gpu (item 4), an A/A at 1 %
#           against the baseline as it came (another machine's runs)
#   slow    +1.5 % device-side at 1 % against the baseline as it came (SEL narrows the cases)
#   gputests tests/gpu alone
#   verify  tests/gpu, then the main command (a session with one call)
#   verifyslow tests/gpu, then slow as time allows
#   fresh / testslow / slowrec  the H200's calls of 2026-12-07 (fifth stop): see each plan
# CALL_S (default 570): the plan's own deadline, counted from this script's start. Leave the
# device call's timeout_s at least 40 s above it for whatever the command does after (a tar into
# $OUT): a call of 2026-12-07 gave CALL_S=465 under timeout_s=490, ran past it in a step's
# teardown, and its tar, and so every file, never came back.
set -u
t0=$(date +%s)
h200=$1; h100=$2; out=$3
. "$(dirname "$0")/h200_common.sh"  # the environment, stamp, gpu_tests; $out/machine.txt
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case $name in *H200*) plan=$h200 ;; *) plan=$h100 ;; esac
echo "GPU: $name -> plan $plan" | tee "$out/plan.txt"
left() { echo $(( ${CALL_S:-570} - ($(date +%s) - t0) )); }
step() {  # step NEED_S LIMIT_S ... : run the rest with LIMIT when NEED_S still fits
  local need=$1; shift
  if [ "$(left)" -lt "$need" ]; then echo "SKIPPED (only $(left) s left): $*" | tee -a "$out/plan.txt"; return; fi
  echo "== $(date +%T) $*" | tee -a "$out/plan.txt"
  "$@"
}
case $plan in
  first)
    step 200 env LIMIT=290 bash benchmarks/gpu_evidence.sh judge "$out/judge"
    step 120 env STRIP=1 LIMIT1=$(( $(left) < 170 ? $(left) - 5 : 170 )) bash benchmarks/gpu_evidence.sh record "$out/rec-dec" "transformer or gpt2" 2
    step 60 env LIMIT1=$(( $(left) - 5 )) bash benchmarks/gpu_evidence.sh record "$out/rec-cifar" "cifar or loader" 1 ;;
  second)
    cp -r baselines "$out/before"  # the baseline as it came: what this machine is judged against
    step 60 env LIMIT1=100 bash benchmarks/gpu_evidence.sh record "$out/rec-dec" "transformer or gpt2" 1
    step 240 gpu_tests 300
    step 100 env BASE="$out/before" FAULT_LIMIT=$(( $(left) - 5 )) bash benchmarks/gpu_evidence.sh resolve "$out/aa" none ;;
  slow)
    step 100 env SLOW_LIMIT=$(( $(left) - 5 )) bash benchmarks/gpu_evidence.sh resolve "$out/slow" "slow,pct=1.5" ;;
  gputests)
    step 240 gpu_tests 300 ;;
  fresh)  # a fresh H200: the main command first (item 5), then the CIFAR and loader cases' second machine
    step 200 env LIMIT=310 bash benchmarks/gpu_evidence.sh judge "$out/judge"
    step 90 env LIMIT1=$(( $(left) - 5 )) bash benchmarks/gpu_evidence.sh record "$out/rec-cifar" "cifar or loader" 1 ;;
  testslow)  # tests/gpu, then +1.5 % against BASE (the baseline as the session began) on SEL
    step 240 gpu_tests 300
    step 100 env SLOW_LIMIT=$(( $(left) - 5 )) bash benchmarks/gpu_evidence.sh resolve "$out/slow" "slow,pct=1.5" ;;
  slowrec)  # +1.5 % on SEL against BASE, then the decoders re-recorded with GPU busy time
    step 100 env SLOW_LIMIT=$(( $(left) - 180 )) bash benchmarks/gpu_evidence.sh resolve "$out/slow" "slow,pct=1.5"
    step 120 env STRIP=1 LIMIT1=$(( $(left) - 5 )) bash benchmarks/gpu_evidence.sh record "$out/rec-dec" "transformer or gpt2" 2 ;;
  verify)  # one call only: the current code's tests/gpu, then the README's main command judged
    step 240 gpu_tests 300
    step 200 env LIMIT=$(( $(left) - 5 )) bash benchmarks/gpu_evidence.sh judge "$out/judge" ;;
  verifyslow)  # tests/gpu, then as many slowdown cases (SEL) as fit
    step 240 gpu_tests 300
    step 100 env SLOW_LIMIT=$(( $(left) - 5 )) bash benchmarks/gpu_evidence.sh resolve "$out/slow" "slow,pct=1.5" ;;
esac
echo "call: $(( $(date +%s) - t0 )) s" | tee -a "$out/plan.txt"
