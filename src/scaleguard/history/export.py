"""Nights exported where teams already look: Bencher's metric format and Otava's CSV.

* **BMF** (Bencher Metric Format, https://bencher.dev/docs/reference/bencher-metric-format):
  ``{case id: {measure: {value, lower_value, upper_value}}}`` for one hardware key (Bencher's
  testbed; ``bencher run --testbed KEY --adapter json --file F``). Measures: ``latency`` (the
  night's step time in ns, Bencher's built-in measure, with the 95 % interval over its runs),
  ``throughput`` (samples/s, the built-in ops/s), ``scaling-efficiency`` and ``peak-memory``
  (bytes), the last two made on first upload.
* **Otava CSV**: one file per case and hardware (Otava's CSV reader takes no empty cell), with
  ``time``, the torch build as attributes and the metrics as columns, plus an ``otava.yaml`` that
  declares them as Otava tests (direction -1 where lower is better).

Pure formatting over history rows: nothing here reads a file or the database.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from scaleguard.evidence.runs import CaseEvidence
from scaleguard.history.database import HistoryRow

BMF_NAME_MAX = 1024  # Bencher: a benchmark name of at most 1024 characters


@dataclass(frozen=True)
class NightFigures:
    """One night (session) of a case: what the exports carry."""

    hardware_key: str
    case_id: str
    session: str
    recorded_at: str
    torch: str
    torch_git: str
    step_s: float  # median of the night's run medians
    step_bounds_s: tuple[float, float] | None  # 95 % interval over the runs (2 or more)
    samples_per_s: float | None
    efficiency: float | None
    peak_mem_bytes: int | None
    runs: int


def rows_of_cases(cases: Iterable[CaseEvidence], hardware_key: str) -> list[HistoryRow]:
    """A saved run's cases as history rows, so a run exports as a history does."""
    rows = []
    for evidence in cases:
        for run in evidence.runs:
            rows.append(
                HistoryRow(
                    run.run_id, evidence.case_id, hardware_key, _opt(evidence.versions.get("torch")),
                    _opt(evidence.versions.get("torch_git")), run.session, run.recorded_at or "", "run",
                    run.median_s, run.scaling_efficiency, run.peak_mem_bytes, run.quarantine, None,
                    run.samples_per_s,
                )
            )  # fmt: skip
    return rows


def _opt(value: object) -> str | None:
    return None if value is None else str(value)


def nights(rows: Sequence[HistoryRow]) -> list[NightFigures]:
    """Every (hardware, case, session) of ``rows`` in time order; quarantined runs left out."""
    groups: dict[tuple[str, str, str], list[HistoryRow]] = {}
    for row in rows:
        if row.quarantine is None:
            groups.setdefault((row.hardware_key, row.case_id, row.session), []).append(row)
    out = []
    for (key, case_id, session), runs in groups.items():
        medians = [r.median_s for r in runs]
        rates = [r.samples_per_s for r in runs if r.samples_per_s]
        effs = [r.efficiency for r in runs if r.efficiency is not None]
        mems = [r.peak_mem_bytes for r in runs if r.peak_mem_bytes]
        out.append(
            NightFigures(
                key, case_id, session, min(r.recorded_at for r in runs), runs[-1].torch or "",
                runs[-1].torch_git or "", statistics.median(medians), _interval(medians),
                statistics.median(rates) if rates else None, statistics.median(effs) if effs else None,
                int(max(mems)) if mems else None, len(runs),
            )
        )  # fmt: skip
    return sorted(out, key=lambda n: (n.hardware_key, n.case_id, n.recorded_at, n.session))


def _interval(medians: Sequence[float]) -> tuple[float, float] | None:
    """95 % interval of the night's level over its runs (t on log medians); None for one run."""
    if len(medians) < 2:
        return None
    from scipy.stats import t

    logs = [math.log(m) for m in medians]
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    half = float(t.ppf(0.975, len(logs) - 1)) * sd / math.sqrt(len(logs))
    try:
        return math.exp(mean - half), math.exp(mean + half)
    except OverflowError:  # runs a night apart by hundreds of orders of magnitude: no interval
        return None


class ExportError(ValueError):
    """Nothing to export, or an export that would mix what must not be mixed."""


def bmf(figures: Sequence[NightFigures], session: str | None = None) -> tuple[str, dict[str, Any]]:
    """(hardware key, BMF document) of the latest night of each case (or of ``session``)."""
    keys = sorted({f.hardware_key for f in figures})
    if not keys:
        raise ExportError("no runs to export (check --case, --hardware-key and --session)")
    if len(keys) > 1:
        raise ExportError(
            f"runs of {len(keys)} hardware keys ({', '.join(keys[:4])}): Bencher takes one testbed per "
            "upload; choose one with --hardware-key"
        )
    chosen: dict[str, NightFigures] = {}
    for night in figures:
        if session is None or night.session == session:
            chosen[night.case_id] = night  # in time order: the latest wins
    if not chosen:
        raise ExportError(f"no night of session {session!r} in the runs selected")
    doc: dict[str, Any] = {}
    for case_id, night in sorted(chosen.items()):
        latency: dict[str, float] = {"value": night.step_s * 1e9}
        if night.step_bounds_s is not None:
            latency |= {
                "lower_value": night.step_bounds_s[0] * 1e9,
                "upper_value": night.step_bounds_s[1] * 1e9,
            }
        measures: dict[str, dict[str, float]] = {"latency": latency}
        if night.samples_per_s:
            measures["throughput"] = {"value": night.samples_per_s}
        if night.efficiency is not None:
            measures["scaling-efficiency"] = {"value": night.efficiency}
        if night.peak_mem_bytes:
            measures["peak-memory"] = {"value": float(night.peak_mem_bytes)}
        doc[case_id[:BMF_NAME_MAX]] = measures
    check_bmf(doc)
    return keys[0], doc


def check_bmf(doc: Any) -> None:
    """Bencher's published JSON schema for BMF (https://bencher.dev/bmf.json), checked by hand:
    an object of benchmarks, each an object of measures, each with a numeric ``value`` and
    optional numeric bounds; names within Bencher's lengths; every number finite (JSON has no
    NaN). Raises ExportError naming the first violation."""
    if not isinstance(doc, dict) or not doc:
        raise ExportError("BMF: the document must be a non-empty object of benchmarks")
    for name, measures in doc.items():
        if not isinstance(name, str) or not 0 < len(name) <= BMF_NAME_MAX:
            raise ExportError(f"BMF: benchmark name {str(name)[:40]!r} must be 1-{BMF_NAME_MAX} characters")
        if not isinstance(measures, dict) or not measures:
            raise ExportError(f"BMF: benchmark {name!r} must hold an object of measures")
        for slug, metric in measures.items():
            if not isinstance(slug, str) or not re.fullmatch(r"[a-z0-9-]{1,64}", slug):
                raise ExportError(f"BMF: measure {slug!r} of {name!r} is not a slug of at most 64 characters")
            if (
                not isinstance(metric, dict)
                or "value" not in metric
                or set(metric) - {"value", "lower_value", "upper_value"}
            ):
                raise ExportError(
                    f"BMF: {name!r}/{slug}: a metric holds value and optional lower/upper_value"
                )
            for field, number in metric.items():
                if (
                    isinstance(number, bool)
                    or not isinstance(number, (int, float))
                    or not math.isfinite(number)
                ):
                    raise ExportError(f"BMF: {name!r}/{slug}/{field} must be a finite number")
            if (
                "lower_value" in metric
                and "upper_value" in metric
                and metric["lower_value"] > metric["upper_value"]
            ):
                raise ExportError(f"BMF: {name!r}/{slug}: lower_value above upper_value")


def bmf_text(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n"


# -- Otava ------------------------------------------------------------------------------------------
OTAVA_METRICS = (  # column, Otava direction (1: higher is better, -1: lower is better)
    ("step_ms", -1),
    ("samples_per_s", 1),
    ("efficiency", 1),
    ("peak_mem_mib", -1),
)


@dataclass(frozen=True)
class OtavaExport:
    """Otava's files ({plain file name: text}) and the nights left out for want of a valid time."""

    files: dict[str, str]
    untimed: int


def otava(figures: Sequence[NightFigures]) -> OtavaExport:
    """One CSV per hardware key and case, and ``otava.yaml`` declaring them. A night without a
    valid recorded time has no place on Otava's time axis and is left out (and counted)."""
    by_case: dict[tuple[str, str], list[NightFigures]] = {}
    untimed = 0
    for night in figures:
        if _iso(night.recorded_at) is None:
            untimed += 1
            continue
        by_case.setdefault((night.hardware_key, night.case_id), []).append(night)
    if not by_case:
        raise ExportError(
            "no runs to export (check --case and --hardware-key)"
            + (f"; {untimed} nights carry no valid recorded time" if untimed else "")
        )
    files: dict[str, str] = {}
    tests: list[str] = []
    for (key, case_id), case_nights in sorted(by_case.items()):
        values: dict[str, list[float | None]] = {
            "step_ms": [n.step_s * 1e3 for n in case_nights],
            "samples_per_s": [n.samples_per_s for n in case_nights],
            "efficiency": [n.efficiency for n in case_nights],
            "peak_mem_mib": [
                None if n.peak_mem_bytes is None else n.peak_mem_bytes / 2**20 for n in case_nights
            ],
        }
        # Otava's reader takes no empty cell: a metric some night lacks is left out of the file
        columns = [(c, d) for c, d in OTAVA_METRICS if all(v is not None for v in values[c])]
        name = otava_file_name(key, case_id)
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["time", "torch", "torch_git", "session", *(c for c, _ in columns)])
        for i, night in enumerate(case_nights):
            writer.writerow(
                [_iso(night.recorded_at) or "", _cell(night.torch), _cell(night.torch_git)]
                + [_cell(night.session)]
                + [f"{values[c][i] or 0.0:.6g}" for c, _ in columns]
            )
        files[name] = buffer.getvalue()
        metrics = "".join(f"      {c}:\n        direction: {d}\n" for c, d in columns)
        tests.append(
            f"  {json.dumps(f'{key}/{case_id}')}:\n    type: csv\n    file: {json.dumps(name)}\n"
            f"    time_column: time\n    attributes: [torch, torch_git, session]\n    metrics:\n{metrics}"
        )
    files["otava.yaml"] = (
        "# written by `scaleguard export --format otava`; run Otava from this directory:\n"
        "#   OTAVA_CONFIG=otava.yaml otava analyze <test name>\ntests:\n" + "".join(tests)
    )
    return OtavaExport(files, untimed)


_UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def otava_file_name(key: str, case_id: str) -> str:
    """A plain file name for one (hardware key, case): letters, digits, ``._-`` only (a stored key
    or case id holding ``/``, ``..`` or a leading ``/`` cannot name a path outside ``--out``),
    bounded in length, and made distinct by a digest of the pair (``cpu-a`` + ``b__m`` and
    ``cpu-a__b`` + ``m`` would otherwise share one file)."""
    slug = _UNSAFE_IN_NAME.sub("_", f"{key}__{case_id}").strip("._-")[:160] or "case"
    digest = hashlib.sha256(f"{key}\0{case_id}".encode()).hexdigest()[:10]
    return f"{slug}-{digest}.csv"


def _iso(recorded_at: str) -> str | None:
    """A time Otava's parser reads (ISO 8601 with an explicit zone, UTC where none was stored), or
    None where the stored text is no time at all (a formula, an empty cell)."""
    try:
        when = datetime.fromisoformat(recorded_at)
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).isoformat()


def _cell(text: str) -> str:
    """A stored value in a CSV cell Otava copies as is: one line, no control characters, and
    nothing a spreadsheet would run as a formula."""
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text
