"""What differs between a run on CPU (gloo on shared cores) and on GPUs, in one table.

Every per-device default of the suite reads from ``DEVICES``: the matrix's profile, precisions
and run settings (``schedule.matrix.plan``), the verdict thresholds and the
run-to-run spread assumed for a young baseline (``evidence.verdict.Thresholds``), the paired A/B
thresholds and pair cap (``schedule.ab``), the pause before re-measuring a spoiled run
(``schedule.session.Schedule``) and a case's deadline (``suite``). Each number's measurement is
in docs/measured.md; a device this table does not name gets the GPU's row.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceDefaults:
    step: float  # relative step-time change that counts
    efficiency: float  # points of scaling efficiency that count
    memory: float  # relative peak-memory change that counts
    prior_spread: float  # run-to-run spread assumed while a baseline is young
    min_spread: float  # floor on a measured run-to-run spread
    eff_prior_spread: float  # the scaling efficiency's between-session spread (points), young baseline
    eff_min_spread: float  # floor on a measured efficiency spread (points)
    ab_step: float  # paired A/B: the machine's drift cancels within a pair
    ab_efficiency: float
    ab_max_pairs: int  # pairs at most before an A/B case is called
    quarantine_pause_s: float  # before re-measuring a run the machine spoiled
    case_timeout_s: float  # one run of a case, start-up included
    # the matrix (schedule.matrix.plan), unless the user's options say otherwise
    profile: str  # smoke: small models; full: ResNet-50, GPT-2 ...
    precisions: tuple[str, ...]
    steps: int  # measured steps of a run
    warmup_min: int  # warmup steps at least (at most 4x, or +10)
    warmup_tolerance: float  # the step time has settled when it moves less than this per step
    # host-launch-bound GPU cases have bimodal steps: more steps pin their median (up to 4x the
    # steps or 20 s). Not on CPU: runs there move ~12 % between sessions, so pinning one run's
    # median to a few percent bought nothing and cost 50 % more wall time (10 CPU sessions)
    target_median_ci: float
    loader_workers: int  # DataLoader workers per rank of a loader case
    channels_last: bool  # convolutions in NHWC (tensor cores)
    # the projection (evidence.projection): may DDP's all-reduce hide under the backward? On
    # CPU each rank has one core and gloo's threads share it: resnet18_cifar ws2 on the 2-core
    # VM all-reduced its 3 buckets in 39 ms alone and exposed 44 ms of communication within a
    # synchronised backward (docs/measured.md). NCCL runs on its own CUDA stream
    comm_overlaps: bool
    # the projection's own error (points of efficiency, worst seen): a case is BELOW-PROJECTION
    # only beyond max(5 points, 3 sigma of its runs, this). CPU: 30 projections of the 6 default
    # DDP ws2 cases over 5 sessions on the 2-core VM erred by a median 3.4 points, worst 24.3
    # (decoder_tiny, whose own measured efficiency spanned 0.55-0.80 across those sessions);
    # across two local Slurm nodes, 30 more: median 4.6, worst 18.5.
    # CUDA: not measured yet (one-GPU machines have no ws2 of their own), the 5-point floor
    projection_error: float
    # the same for FSDP's projection; None: not measured on this device, so an FSDP case's
    # projection is shown but never called BELOW-PROJECTION. CPU: 30 projections of the 5
    # FSDP ws2 cases over 6 sessions on the 2-core VM erred by a median 2.5 points, worst 27.4
    # (transformer_tiny strong, once: 0.89 projected, 0.62 measured; its other 5 within 6)
    fsdp_projection_error: float | None = None
    # a young baseline's efficiency as two levels (evidence.stats.run_shift): the spread of a
    # session's offset, which its runs share, and the floor on the spread of runs within a
    # session. 0: not measured on this device, and the single-level prior above is used
    eff_session_spread: float = 0.0
    eff_run_spread: float = 0.0

    def projection_error_of(self, mode: str) -> float | None:
        return self.fsdp_projection_error if mode == "fsdp" else self.projection_error


# The scaling efficiency's spread between sessions (points), for a young baseline: the standard
# deviation of ws2's efficiency over 10 identical one-run sessions of transformer_tiny ddp on the
# 2-core VM was 4.6 points (median 0.837; 8 of 10 within 2.5 points, two at -8.1 and +9.3:
# heavy tails). The step's prior would have said sqrt(2) x 12 % x 0.84 = 14 points
# (benchmarks/efficiency_power.py, docs/measured.md)
EFF_PRIOR_CPU = 0.046
# The same spread in its two levels: 8 identical sessions of 3 interleaved runs each (the
# README's recording) of the same case on the same VM read a pooled within-session run spread
# of 4.1 points and a spread of session means of 3.7, so a session's own offset spreads
# sqrt(3.7^2 - 4.1^2 / 3) = 2.8 points (2.1 by the 10 one-run sessions above: 4.6^2 - 4.1^2).
# Rounded up: 3 and 4 points (docs/measured.md, 2026-12-06 "efficiency as two levels")
EFF_SESSION_CPU = 0.03
EFF_RUN_CPU = 0.04

DEVICES: dict[str, DeviceDefaults] = {
    # session medians of identical runs spread by a median 12 % on a 2-core VM (4-26 % per
    # case); A/B pairs 2-8 %, |B/A| at most 4 %; 10 pairs resolve ~10 %
    "cpu": DeviceDefaults(
        step=0.10, efficiency=0.10, memory=0.10, prior_spread=0.12, min_spread=0.04,
        eff_prior_spread=EFF_PRIOR_CPU, eff_min_spread=0.02,
        ab_step=0.05, ab_efficiency=0.05, ab_max_pairs=10, quarantine_pause_s=20.0,
        case_timeout_s=300.0, profile="smoke", precisions=("fp32",), steps=30, warmup_min=5,
        warmup_tolerance=0.03, target_median_ci=0.0, loader_workers=0, channels_last=False,
        comm_overlaps=False, projection_error=0.25, fsdp_projection_error=0.30,
        eff_session_spread=EFF_SESSION_CPU, eff_run_spread=EFF_RUN_CPU,
    ),
    # bs-256 ResNet-50 runs moved 0.1-0.5 % between runs and sessions on the H200, so 3 %
    # catches a 5 % slowdown; A/B pairs spread < 1 %: 6 pairs resolve 3 %
    "cuda": DeviceDefaults(
        step=0.03, efficiency=0.03, memory=0.10, prior_spread=0.01, min_spread=0.002,
        eff_prior_spread=0.01, eff_min_spread=0.002,
        ab_step=0.03, ab_efficiency=0.03, ab_max_pairs=6, quarantine_pause_s=30.0,
        case_timeout_s=900.0, profile="full", precisions=("fp32", "bf16"), steps=50,
        warmup_min=10, warmup_tolerance=0.01, target_median_ci=0.0125, loader_workers=4,
        channels_last=True, comm_overlaps=True, projection_error=0.05,
    ),
}  # fmt: skip


@dataclass(frozen=True)
class KindSpread:
    """How far a device-bound case's run median moves between sessions and machines of one GPU
    kind: what a young baseline (one recording session) is assumed to spread, instead of the
    device's general ``prior_spread``. Measured by ``benchmarks/kind_spread.py`` from the kind's
    committed baseline: the pooled between-session standard deviation (log) of the cases whose
    GPU is busy >= 90 % of the step, taken at its one-sided 90 % upper confidence bound."""

    spread: float
    evidence: str  # what it was measured on, said in the story that assumes it


# keyed by torch's device name (``torch.cuda.get_device_name``), as the runs record it
KIND_SPREADS: dict[str, KindSpread] = {
    # 5 device-bound ResNet-50 cases, runs from 2 machines (2026-12-05): pooled sd 0.17 %
    # (5 df), case max-min 0.01-0.45 %
    "NVIDIA H200": KindSpread(0.0030, "5 device-bound cases on 2 H200 machines, pooled sd 0.17 %"),
    # 12 device-bound cases (GPT-2, ResNet-50 bs 256 and fp32 bs 64, transformer bs 128), runs
    # from 2 freshly started machines (2026-12-06): pooled sd 0.27 % (12 df); ResNet-50 0.02-0.19 %,
    # GPT-2 0.38-0.47 % (machine B 0.5-0.7 % faster on all four)
    "NVIDIA H100 80GB HBM3": KindSpread(0.0038, "12 device-bound cases on 2 H100 machines, pooled sd 0.27 %"),
}


def kind_spread(device_name: str) -> KindSpread | None:
    return KIND_SPREADS.get(device_name)


def defaults_for(device: str) -> DeviceDefaults:
    return DEVICES.get(device, DEVICES["cuda"])
