"""Bridge to pytest-benchmark: hand it the per-step samples that the ranks measured.

pytest-benchmark has no public API for timings measured in other processes (its issue #52).
We use ``BenchmarkFixture._make_stats`` and ``Stats.update``, the two calls its own timing loop
makes, so ``--benchmark-save`` JSON holds rounds = measured steps and min/median/mean/stddev of
exactly those samples. Both exist unchanged in pytest-benchmark 4.0 through 5.x; the supported
range is pinned in pyproject.toml and ``tests/plugin`` checks the saved JSON against the raw
samples, so a change there fails our tests rather than silently corrupting results.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scaleguard.case import CaseSpec
from scaleguard.evidence.files import Fields, FileFormatError, content_id, read_document
from scaleguard.evidence.projection import Projection
from scaleguard.evidence.runs import CaseEvidence, RunRecord, config_of
from scaleguard.evidence.upgrades import saved_case_from_1
from scaleguard.evidence.verdict import Verdict
from scaleguard.machine.env import HostFingerprint
from scaleguard.schema import SCHEMA_VERSION

MODE_LABEL = "scaleguard: steps timed inside worker processes"


def extra_info(
    spec: CaseSpec,
    evidence: CaseEvidence,
    verdict: Verdict | None,
    peak_tflops: float | None = None,
    projection: Projection | None = None,
) -> dict[str, Any]:
    """What a saved run holds of a case beside its steps: the case, every run of this session
    (the runs in their one stored shape: ``scaleguard compare`` reads them), and the figures."""
    from scaleguard.evidence.metrics import throughput

    last = evidence.runs[-1]
    info: dict[str, Any] = {
        "scaleguard_schema": SCHEMA_VERSION,
        "case_id": spec.case_id,
        "group_id": spec.group_id,
        "config": config_of(spec.to_dict()),
        "versions": evidence.versions,
        # every run of this session, steps included: `scaleguard compare` judges on these
        "runs": [r.to_dict() for r in evidence.runs],
        "run_spread": evidence.run_spread(),
        "model": spec.model,
        "mode": spec.mode,
        "world_size": spec.world_size,
        "precision": spec.precision,
        "scaling": spec.scaling,
        "inputs": spec.inputs,
        "profile": spec.profile,
        "device": spec.device,
        "global_batch": spec.global_batch,
        "per_rank_batch": spec.per_rank_batch,
        "samples_per_s": evidence.samples_per_s(),
        "scaling_efficiency": evidence.efficiency(),
        "median_step_s": evidence.median_s(),
        "device_name": last.device_name,
        "runtime": last.runtime,
        "settings": last.settings,
        "notes": sorted({n for r in evidence.runs for n in r.notes}),
        # samples/s, tokens/s per GPU, TFLOPS per GPU, MFU (null where the peak is unknown)
        "throughput": throughput(spec, evidence, last.device_name, peak_tflops),
        "workload": spec.workload or None,
    }
    if verdict is not None:
        info["verdict"] = verdict.status.value
        info["verdict_story"] = verdict.story
        # the figures the table's "vs base" and "can call" columns show, OK rows included
        info["vs_baseline"] = verdict.movement()
    if projection is not None:
        # what the case should have done from its ws1 run (evidence.projection), beside the measured
        info["projection"] = projection.to_dict()
    return info


def record(
    benchmark: Any,
    spec: CaseSpec,
    evidence: CaseEvidence,
    verdict: Verdict | None,
    peak_tflops: float | None = None,
    projection: Projection | None = None,
) -> None:
    """Store the case's measured steps (every run of this session, in order) as the
    benchmark's rounds, and the runs themselves in ``extra_info``."""
    if getattr(benchmark, "disabled", False):
        return
    if getattr(benchmark, "_mode", None):
        raise RuntimeError(f"the benchmark fixture was already used in {benchmark._mode} mode")
    benchmark._mode = MODE_LABEL
    stats = benchmark._make_stats(1)  # one iteration per round: a round is one training step
    for run in evidence.runs:
        for step_s in run.step_s:
            stats.update(step_s)
    benchmark.extra_info.update(extra_info(spec, evidence, verdict, peak_tflops, projection))


def update_machine_info(
    machine_info: dict[str, Any],
    host: HostFingerprint,
    device: str,
    profile: str,
    threads_per_rank: int,
    hardware_key: str,
) -> None:
    """Add what decides comparability: torch/CUDA/cuDNN/NCCL, GPUs, CPU, threads per rank."""
    machine_info["scaleguard"] = {
        **host.to_dict(),
        "device": device,
        "profile": profile,
        "threads_per_rank": threads_per_rank,
        "hardware_key": hardware_key,
    }
    machine_info.update(
        {
            "torch_version": host.torch,
            "cuda_version": host.cuda,
            "cudnn_version": host.cudnn,
            "nccl_version": host.nccl,
            "gpu_name": host.gpu_name,
            "gpu_count": host.gpu_count,
            "cpu_model": host.cpu_model,
            "threads_per_rank": threads_per_rank,
        }
    )


def is_saved_run(data: dict[str, Any]) -> bool:
    return "benchmarks" in data and "machine_info" in data


def read_saved_run(path: Path, data: dict[str, Any]) -> tuple[str | None, dict[str, CaseEvidence]]:
    """The hardware key and the cases of a ``--benchmark-save`` JSON written by scaleguard.
    Runs saved before schema 2 (steps, no runs) load as one run per case."""
    fix = "pass a file written by pytest perf/ --benchmark-save=NAME"
    top = Fields.of(data, f"saved run {path}", fix)
    machine = top.obj("machine_info")
    key: str | None = None
    if isinstance(machine.data.get("scaleguard"), dict) and machine.data["scaleguard"]:
        ours = machine.obj("scaleguard")
        from scaleguard.evidence.baseline import check_key, hardware_key

        if ours.data.get("hardware_key") is not None:
            key = check_key(str(ours.string("hardware_key")), f"{ours.where}.hardware_key")
        else:  # saved before the key was stored: derived from its parts
            key = hardware_key(
                ours.string("device"), ours.text("gpu_name", optional=True),
                int(ours.integer("gpu_count", 0, 1_000_000, optional=True) or 0),
                ours.string("cpu_model"), int(ours.integer("threads_per_rank", 1, 1_000_000) or 1),
            )  # fmt: skip
    commit_info = machine.data.get("commit_info")
    commit = commit_info.get("id") if isinstance(commit_info, dict) else None
    commit = commit if isinstance(commit, str) else None
    cases: dict[str, CaseEvidence] = {}
    for index, bench in enumerate(top.items("benchmarks")):
        entry = Fields.of(bench, f"saved run {path}, benchmarks[{index}]", fix)
        info_raw = entry.raw_dict("extra_info", optional=True)
        if "case_id" not in info_raw:
            continue  # some other benchmark in the same file
        info = Fields(info_raw, f"{entry.where}.extra_info", fix)
        where = f"{info.where} ({info_raw.get('case_id')})"
        if "runs" in info_raw:
            runs = tuple(
                RunRecord.from_dict(r, f"{where}.runs[{i}]", fix) for i, r in enumerate(info.items("runs"))
            )
            if not runs:
                raise FileFormatError(f"{where}: field 'runs' is empty; {fix}")
        else:  # schema 1: the case's steps as one run
            night = content_id(path.stem, top.data.get("datetime"), machine.data.get("node"), commit)
            upgraded = saved_case_from_1(info, night, path.stem, commit)
            upgraded["peak_mem_bytes"] = _peak_bytes(info)
            runs = (RunRecord.from_dict(upgraded, f"{where}.runs[0]", fix),)
        versions = info.scalars("versions", optional=True) or info.scalars("runtime", optional=True)
        torch_version = machine.text("torch_version", optional=True)
        evidence = CaseEvidence(
            case_id=str(info.ident("case_id")),
            group_id=str(info.ident("group_id")),
            world_size=int(info.integer("world_size", 1, 1_000_000) or 1),
            config=info.scalars("config"),
            versions=versions or {"torch": torch_version},
            runs=runs,
        )
        cases[evidence.case_id] = evidence
    if not cases:
        raise FileFormatError(f"saved run {path}: a pytest-benchmark file without scaleguard cases; {fix}")
    return key, cases


def _peak_bytes(info: Fields) -> int:
    """Schema 1: the largest rank's peak memory, from a list of byte counts."""
    return max(info.byte_counts("peak_mem_bytes")) if "peak_mem_bytes" in info.data else 0


def read_document_any(path: Path) -> dict[str, Any]:
    return read_document(
        path, "run or baseline file", "pass a saved run (--benchmark-save) or a baseline file"
    )


def write_saved_run(path: Path, ledger: Any, machine_info: dict[str, Any], label: str) -> None:
    """One side of an A/B session as a ``--benchmark-save`` file: ``scaleguard compare`` and
    ``pytest-benchmark compare`` read it like a run of ``pytest perf/``."""
    import datetime

    from pytest_benchmark.stats import Stats

    from scaleguard.evidence.files import atomic_write_json

    benchmarks = []
    for case_id in ledger.completed:
        evidence = ledger.evidence(case_id)
        stats = Stats()
        for run in evidence.runs:
            for step_s in run.step_s:
                stats.update(step_s)
        data = stats.as_dict()
        data["data"] = list(stats.data)
        data["iterations"] = 1  # one training step per round, as in the suite's own saves
        name = f"test_train_step[{case_id}]"
        benchmarks.append(
            {
                "group": None, "name": name, "fullname": f"perf/test_train_step.py::{name}",
                "params": {"perf_case": case_id}, "param": case_id,
                "extra_info": extra_info(
                    ledger.specs[case_id], evidence, None, projection=ledger.projection(case_id)
                ),
                "options": {"disable_gc": False, "timer": "perf_counter", "min_rounds": 1,
                            "max_time": 0, "min_time": 0, "warmup": False},
                "stats": data,
            }
        )  # fmt: skip
    versions = next(iter(ledger.records.values()))[-1].runtime if ledger.records else {}
    info = dict(machine_info)
    info.update({"torch_version": versions.get("torch"), "cuda_version": versions.get("cuda"),
                 "cudnn_version": versions.get("cudnn"), "nccl_version": versions.get("nccl")})  # fmt: skip
    info["scaleguard"] = {**(info.get("scaleguard") or {}), "ab_side": label}
    atomic_write_json(
        path,
        {
            "machine_info": info,
            "commit_info": {},
            "benchmarks": sorted(benchmarks, key=lambda b: b["param"]),
            "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "version": "5.2.3",
        },
    )
