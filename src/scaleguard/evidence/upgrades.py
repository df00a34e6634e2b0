"""Files of older schemas, upgraded dict to dict into the current shape before the one reader
reads them (as asv's ``Results`` upgrades its old result files): a step only restructures, and
validates just what it computes from (the samples a run id is a digest of, the spec a rate is
derived from); every field it passes on is read and checked by the current reader
(``RunRecord.from_dict``, ``CaseEvidence.from_dict``), so an old file meets the same checks as
a new one and there is no second reader to keep in step.

Steps (``scaleguard.schema`` says what each schema added):
- ``baseline_entry_from_1``: a schema-1 baseline entry (one run's steps, no runs) -> an entry
  with that one run;
- ``saved_case_from_1``: a schema-1 case of a saved pytest-benchmark run (steps in
  ``extra_info``) -> its one run;
- ``run_file_from_2``: a schema-2 torchrun record (the run's fields beside its spec) ->
  ``{spec, run}``.
"""

from __future__ import annotations

from typing import Any

from scaleguard.case import CaseSpec
from scaleguard.evidence.files import Fields, content_id, read_object
from scaleguard.evidence.stats import StepSummary

# the fields of an entry (``CaseEvidence``) a schema-1 entry holds as they are now
_ENTRY_FIELDS = ("case_id", "group_id", "world_size", "config", "versions")
# a schema-1 run's fields kept as they are (read by ``RunRecord`` as any run's)
_SCHEMA1_RUN_FIELDS = ("samples_per_s", "peak_mem_bytes", "scaling_efficiency", "speedup", "commit")
# what a schema-2 torchrun record held: the run's fields beside its spec (before schema 3)
SCHEMA2_RUN_FILE_FIELDS = frozenset({
    "spec", "step_s", "summary", "samples_per_s", "peak_mem_bytes", "mem_kind", "warmup_steps",
    "steady", "device_name", "runtime", "settings", "notes", "machine_state", "quarantine", "wall_s",
    "phases_s", "run_id", "anatomy", "process_runs_before", "flops_per_step", "schema_version",
})  # fmt: skip
# a schema-2 record's run fields that a run holds under the same name now
_SCHEMA2_SAME = (
    "mem_kind", "warmup_steps", "steady", "device_name", "runtime", "settings", "notes", "quarantine",
    "wall_s", "phases_s", "anatomy", "process_runs_before", "flops_per_step",
)  # fmt: skip


def _present(data: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The fields of ``names`` that ``data`` holds, None left out (the reader's default)."""
    return {n: data[n] for n in names if data.get(n) is not None}


def baseline_entry_from_1(raw: Any, where: str, fix: str) -> dict[str, Any]:
    """A schema-1 baseline entry as an entry of one run. The run's id is a digest of the case,
    its time and its samples (entries without a time must not collide), as it has always been:
    a history that imported the file keeps knowing the run."""
    f = Fields.of(raw, where, fix)
    step_s = f.samples("step_s")
    recorded_at = f.text("recorded_at", optional=True)
    run = {
        "run_id": "schema1-" + content_id(f.data.get("case_id"), recorded_at, step_s),
        "session": f"schema1-{recorded_at or 'unknown'}",
        "step_s": list(step_s),
        "recorded_at": recorded_at or "",
        **_present(f.data, _SCHEMA1_RUN_FIELDS),
    }
    if f.flag("throttled"):
        run["quarantine"] = "throttled (schema 1)"
    return {**_present(f.data, _ENTRY_FIELDS), "runs": [run]}


def saved_case_from_1(info: Fields, night: str, stem: str, commit: str | None) -> dict[str, Any]:
    """A schema-1 case of a saved run (``extra_info`` with the case's steps) as its one run; ids
    from the content: two hosts' ``0001_nightly.json`` share the name, never the samples."""
    steps = info.samples("step_s")
    run = {
        "run_id": f"{stem}-{content_id(night, info.data.get('case_id'), steps)}",
        "session": f"{stem}-{night}",
        "step_s": list(steps),
        **_present(info.data, ("samples_per_s", "scaling_efficiency")),
        "commit": commit,
    }
    if info.flag("throttled"):
        run["quarantine"] = "throttled"
    return run


def run_file_from_2(f: Fields) -> dict[str, Any]:
    """A schema-2 torchrun record as ``{spec, run}``: the run's fields moved under ``run``, its
    per-rank peaks and the GPUs' and host's records (then under ``machine_state``) where a run
    holds them now, and its rate derived as the run derives it."""
    f.known(SCHEMA2_RUN_FILE_FIELDS)
    spec = CaseSpec.from_fields(f.obj("spec"))
    for required in ("mem_kind", "device_name"):
        f.string(required)  # a schema-2 record always said them: one missing is no such record
    f.versions("runtime")
    f.scalars("settings")
    step_s = f.samples("step_s")
    peaks = f.byte_counts("peak_mem_bytes")
    state = Fields(f.raw_dict("machine_state", optional=True), f"{f.where}.machine_state", f.fix)

    def part(name: str) -> dict[str, Any]:
        # each part an object, as schema 2 wrote it (a list there was a TypeError at the merge)
        return read_object(state, name) if state.data.get(name) is not None else {}

    host = {**part("foreign_load"), **({"slurm": part("slurm")} if "slurm" in state.data else {})}
    same = _present(f.data, _SCHEMA2_SAME)
    if not same.get("anatomy"):
        same.pop("anatomy", None)  # schema 2 wrote {} for a run without one
    run = {
        **same,
        "run_id": "",
        "session": f.text("run_id", optional=True) or "",
        "step_s": list(step_s),
        "samples_per_s": spec.global_batch / StepSummary.of(step_s).median_s,
        "peak_mem_bytes": max(peaks),
        "rank_peak_mem_bytes": list(peaks),
        "gpu": part("during_steps"),
        "gpu_whole_run": part("whole_run"),
        "host": host,
    }
    return {"spec": f.data["spec"], "run": run}
