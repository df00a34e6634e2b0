# Sourced by the H200 scripts (after phase=$1 out=$2): the environment every run there needs, a
# timestamping filter for logs, and the machine's facts in $out/machine.txt.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# the editable install does not register the pytest11 entry point on that machine (README)
# --perf-inject-faults: the evidence scripts inject slowdowns on purpose (harmless where none is set)
export PYTHONPATH=$PWD/src PYTEST_ADDOPTS="-p scaleguard.plugin -p no:cacheprovider --perf-inject-faults"
mkdir -p "$out"
stamp() { local start=$(date +%s); while IFS= read -r line; do echo "$(( $(date +%s) - start )) $line"; done; }
python -c "import torch, torchvision; torch.zeros(1, device='cuda')"
(nproc; lscpu | grep -E "Model name|Socket|NUMA node|MHz"; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv) > "$out/machine.txt" 2>&1
# tests/gpu under a deadline, its log in $out/gpu-tests.log (300 s: 223 s on an H100 whose host ran
# the machine probe 25 % slow, where 240 s cut the 7th test)
gpu_tests() {
  timeout -s INT "${1:-300}" python -m pytest tests/gpu -v -rfE --durations=10 2>&1 | stamp > "$out/gpu-tests.log"
  tail -3 "$out/gpu-tests.log"
}
