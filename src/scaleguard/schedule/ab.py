"""Paired A/B: two Python installs (say torch 2.13 and 2.14) measured alternately on one machine
in one session, judged on per-pair log ratios.

Comparing tonight's run with a baseline recorded days ago mixes the upgrade with everything else
that moved (the machine, its load, its clocks); pairing cancels what A and B share. As Chromium
Pinpoint does, each pair runs A and B back to back in fresh processes, in AB or BA order with
equal counts of each, shuffled; pairs are added in blocks of two until the ratio is decided
(REGRESSED / IMPROVED / SAME) or a cap is reached (INCONCLUSIVE). A pair with a failed or
disturbed side is dropped on both sides, and reported.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps

from scaleguard.case import FAULT_ENV, CaseSpec
from scaleguard.devices import defaults_for
from scaleguard.evidence.files import ID_PATTERN
from scaleguard.evidence.ledger import Ledger
from scaleguard.evidence.runs import RunRecord
from scaleguard.evidence.verdict import Status, Thresholds, judge_shift
from scaleguard.machine import processes
from scaleguard.ranks.protocol import CaseFailedError, Interpreter
from scaleguard.schedule import runner

MAX_DROPPED = 2  # failed pairs before the case itself fails
_PROBE = """
import json, platform, sys
try:
    import torch
except Exception as e:
    print(json.dumps({"missing": "torch", "error": repr(e)}))
    sys.exit(0)
try:
    import scaleguard.ranks.worker
except Exception as e:
    print(json.dumps({"missing": "scaleguard", "error": repr(e)}))
    sys.exit(0)
try:  # VmHWM, not ru_maxrss: ru_maxrss survives exec and would report the launcher's size
    hwm = int(open("/proc/self/status").read().split("VmHWM:", 1)[1].split()[0]) * 1024
except (OSError, IndexError, ValueError):
    hwm = None
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "git": getattr(torch.version, "git_version", None),
        # what a rank holds before any model: on CPU a run's peak memory is its resident set,
        # so an install with bigger libraries (a CUDA build) shows there; the story says it
        "import_rss_bytes": hwm}
print(json.dumps(info))
"""


class ABInputError(ValueError):
    """An interpreter that cannot be a side: missing, or lacking torch or scaleguard."""


@dataclass(frozen=True)
class Side:
    label: str  # "A" or "B"
    interpreter: Interpreter
    versions: dict[str, Any]  # from the probe; the ranks report CUDA/cuDNN/NCCL as they see them


PROBE_TIMEOUT_S = 180.0
PROBE_OUTPUT_BYTES = 1 << 20  # the probe prints one short JSON line; past this it is not ours
_PROBE_KEYS = {"torch": str, "cuda": str, "python": str, "git": str, "import_rss_bytes": int}


def probe(label: str, python: str, env: Sequence[tuple[str, str]] = ()) -> Side:
    """Check an interpreter before anything is spawned with it.

    Raises:
        ABInputError: missing, not runnable, without torch or scaleguard, or printing something
            other than the probe's one JSON object (read bounded in time and size).
    """
    resolved = resolve_interpreter(label, python)
    # probed with the side's own environment: a PYTHONPATH or LD_PRELOAD given for B changes
    # what B's ranks import, so the versions in the header must come from that environment
    environ = {**os.environ, **dict(env)}
    code, out, err = run_bounded(
        [resolved, "-c", _PROBE], environ, PROBE_TIMEOUT_S, PROBE_OUTPUT_BYTES, label
    )
    return side_from_probe(label, python, Interpreter(resolved, tuple(env)), code, out, err)


PROBE_CODE = _PROBE  # what a side's interpreter runs to answer (also inside a Slurm step)


def side_from_probe(
    label: str, python: str, interpreter: Interpreter, code: int, out: bytes, err: bytes
) -> Side:
    """The side, from what its interpreter printed for ``PROBE_CODE`` (here or in a step).

    Raises:
        ABInputError: no probe answer, torch or scaleguard missing, a bad value.
    """
    info = _probe_answer(out)
    if info is None:
        tail = err[-300:].decode("utf-8", "replace").strip() or "(nothing on stderr)"
        raise ABInputError(
            f"side {label}: {python} did not answer the probe as a Python with torch and scaleguard "
            f"would (exit {code}; stdout was not the probe's JSON object): {tail}"
        )
    if info.get("missing") in ("torch", "scaleguard"):
        error = str(info.get("error", ""))[:300]
        if info["missing"] == "torch":
            raise ABInputError(
                f"side {label}: {python} has no torch ({error}); install it in that environment"
            )
        raise ABInputError(
            f"side {label}: {python} has no scaleguard ({error}); run "
            f"`{python} -m pip install -e <this checkout>` there"
        )
    versions: dict[str, Any] = {}
    for key, kind in _PROBE_KEYS.items():
        value = info.get(key)
        if value is None:
            continue
        if (
            not isinstance(value, kind)
            or isinstance(value, bool)
            or (isinstance(value, str) and len(value) > 200)
        ):
            raise ABInputError(
                f"side {label}: {python} answered the probe with a bad {key!r}: {str(value)[:80]!r}"
            )
        versions[key] = value
    if not isinstance(versions.get("torch"), str) or not ID_PATTERN.fullmatch(versions["torch"]):
        raise ABInputError(f"side {label}: {python} answered the probe without a torch version")
    return Side(label, interpreter, versions)


def _probe_answer(out: bytes) -> dict[str, Any] | None:
    """The probe's JSON object (its last line that is one: srun may print its own lines
    after it), or None for anything else."""
    try:
        lines = out.decode("utf-8").strip().splitlines()
    except UnicodeDecodeError:
        return None
    for line in reversed(lines[-50:]):
        if not line.lstrip().startswith("{"):
            continue
        try:
            info = json.loads(line)
        except (ValueError, RecursionError):
            return None
        return info if isinstance(info, dict) else None
    return None


def run_bounded(
    command: Sequence[str], env: dict[str, str], timeout_s: float, limit: int, label: str
) -> tuple[int, bytes, bytes]:
    """Run ``command``; (exit code, stdout, the end of stderr). An interpreter that prints more than
    ``limit`` bytes or runs past ``timeout_s`` is stopped and refused: nothing it prints is
    buffered whole."""
    import selectors

    try:
        child = subprocess.Popen(
            list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True
        )
    except OSError as exc:
        raise ABInputError(f"side {label}: {command[0]} cannot be run: {exc}") from None
    assert child.stdout is not None and child.stderr is not None
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout_s
    problem = None
    with selectors.DefaultSelector() as sel:
        sel.register(child.stdout, selectors.EVENT_READ, out)
        sel.register(child.stderr, selectors.EVENT_READ, err)
        while sel.get_map() and problem is None:
            left = deadline - time.monotonic()
            if left <= 0:
                problem = f"did not answer the probe within {timeout_s:g} s"
                break
            for key, _ in sel.select(timeout=min(left, 1.0)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
                if len(out) > limit:
                    problem = f"printed more than {limit} bytes when probed"
                del err[:-4096]  # only the end of stderr is ever shown
    if problem is not None:
        processes.stop_group(child, ())  # SIGKILL to its group, reaped with a deadline
    try:
        code = child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        processes.stop_group(child, ())
        code = child.wait()
    child.stdout.close()
    child.stderr.close()
    if problem is not None:
        raise ABInputError(f"side {label}: {command[0]} {problem}")
    return code, bytes(out), bytes(err)


def parse_env(items: Sequence[str], option: str) -> list[tuple[str, str]]:
    """``KEY=VALUE`` items for one side's ranks."""
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise ABInputError(f"{option} takes KEY=VALUE with a variable name as KEY, got {item!r}")
        pairs.append((key, value))
    return pairs


def resolve_interpreter(label: str, python: str) -> str:
    """A path, or a command found on PATH as a shell would (``python3``), as an absolute path."""
    if not python:
        raise ABInputError(f"side {label}: the interpreter is empty")
    if os.sep not in python:
        found = shutil.which(python)
        if found is None:
            raise ABInputError(f"side {label}: interpreter {python} is neither a path nor a command on PATH")
        return os.path.abspath(found)
    path = Path(python)
    if not path.exists():
        raise ABInputError(f"side {label}: interpreter {python} does not exist")
    if path.is_dir() or not os.access(path, os.X_OK):
        raise ABInputError(f"side {label}: {python} is not an executable file")
    return str(path.absolute())


@dataclass(frozen=True)
class PairedShift:
    """B against A over n pairs: mean log ratio (relative) or mean difference (absolute)."""

    change: float
    ci: tuple[float, float]
    p_up: float  # one-sided: B larger than A
    p_down: float
    n: int
    spread: float  # standard deviation of the per-pair log ratio (or difference)


def paired_shift(
    a: Sequence[float], b: Sequence[float], relative: bool, min_spread: float = 1e-4
) -> PairedShift:
    """One-sample t on per-pair log ratios (relative) or differences (absolute)."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    d = np.log(y / x) if relative else y - x
    n = d.size
    if n < 2:
        raise ValueError("paired_shift needs at least two pairs")
    sd = max(float(d.std(ddof=1)), min_spread)
    se = sd / math.sqrt(n)
    law = sps.t(n - 1)
    mean = float(d.mean())
    half = float(law.ppf(0.975)) * se
    low, high = mean - half, mean + half
    if relative:
        change, ci = math.expm1(mean), (math.expm1(low), math.expm1(high))
    else:
        change, ci = mean, (low, high)
    return PairedShift(change, ci, float(law.sf(mean / se)), float(law.cdf(mean / se)), n, sd)


def injected_fault(side: Side) -> str:
    """The fault a side's ranks inject: its own environment's, else the session's (as
    ``ranks.faults.requested`` reads it)."""
    own = dict(side.interpreter.env).get(FAULT_ENV)
    return (own if own is not None else os.environ.get(FAULT_ENV, "")).strip()


@dataclass(frozen=True)
class ABVerdict:
    case_id: str
    status: Status  # REGRESSED, IMPROVED, SAME, INCONCLUSIVE; NOISY: every pair disturbed
    story: str
    step: PairedShift | None = None
    efficiency: PairedShift | None = None
    memory: PairedShift | None = None
    orders: tuple[str, ...] = ()  # "AB" / "BA" per kept pair
    dropped: tuple[str, ...] = ()  # why each dropped pair was dropped
    # each question's own answer: step, efficiency (ws > 1), memory -> REGRESSED / IMPROVED /
    # SAME / INCONCLUSIVE; the status above is the worst of them
    metrics: dict[str, Status] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status is Status.REGRESSED


def _judge(shift: PairedShift, threshold: float, alpha: float, relative: bool = True,
           worse_when_up: bool = True) -> Status:  # fmt: skip
    return judge_shift(
        shift.change, shift.ci, shift.p_up, shift.p_down, threshold, alpha,
        relative=relative, worse_when_up=worse_when_up,
    )  # fmt: skip


def metric_verdicts(
    step: PairedShift, effs: PairedShift | None, mems: PairedShift | None, thr: Thresholds
) -> dict[str, Status]:
    """Every metric judged on its own, by the one verdict engine: a memory verdict must not
    leave step time undecided."""
    out = {"step": _judge(step, thr.step, thr.alpha)}
    if effs is not None:
        out["efficiency"] = _judge(effs, thr.efficiency, thr.alpha, relative=False, worse_when_up=False)
    if mems is not None:
        out["memory"] = _judge(mems, thr.memory, thr.alpha)
    return out


def decide_pairs(
    case_id: str,
    a: Sequence[float],
    b: Sequence[float],
    thr: Thresholds,
    eff: tuple[Sequence[float], Sequence[float]] | None = None,
    mem: tuple[Sequence[float], Sequence[float]] | None = None,
) -> tuple[Status, PairedShift, PairedShift | None, PairedShift | None, list[str]]:
    """Status and shifts from per-pair step medians (and efficiencies, peak memories): REGRESSED
    when any metric is; else IMPROVED when step time is; SAME when step time and efficiency are
    the same; else INCONCLUSIVE."""
    # the device's floor on a measured spread, as for the runs of a night: two pairs that happen
    # to agree (df 1) must not make a change look certain. Seen on the 2-core VM: an A/A on a
    # Slurm allocation read IMPROVED -9.8 % after 2 pairs with a pair spread of 0.3 % (p=0.007)
    step = paired_shift(a, b, relative=True, min_spread=thr.min_spread)
    effs = (
        paired_shift(eff[0], eff[1], relative=False, min_spread=thr.min_spread)
        if eff and len(eff[0]) >= 2
        else None
    )
    mems = paired_shift(mem[0], mem[1], relative=True, min_spread=1e-3) if mem else None
    metrics = metric_verdicts(step, effs, mems, thr)
    reasons = [m for m in ("step", "efficiency", "memory") if metrics.get(m) is Status.REGRESSED]
    if reasons:
        return Status.REGRESSED, step, effs, mems, reasons
    if metrics["step"] is Status.IMPROVED:
        return Status.IMPROVED, step, effs, mems, []
    if metrics["step"] is Status.SAME and metrics.get("efficiency", Status.SAME) is Status.SAME:
        return Status.SAME, step, effs, mems, []
    return Status.INCONCLUSIVE, step, effs, mems, []


def undecided(verdict: ABVerdict) -> bool:
    """More pairs help: step time or efficiency is not decided yet (memory is steady enough
    to decide in the first pairs, and must not end the case before the others)."""
    return any(verdict.metrics.get(m) is Status.INCONCLUSIVE for m in ("step", "efficiency"))


@dataclass(frozen=True)
class ABSchedule:
    min_pairs: int = 2
    max_pairs: int = 10
    block: int = 2  # one AB and one BA per block, in shuffled order
    seed: int = 0

    @classmethod
    def for_device(cls, device: str, max_pairs: int | None = None, seed: int = 0) -> ABSchedule:
        """CPU pairs spread ~5 % (shared cores): 10 pairs resolve ~10 %; CUDA pairs spread
        <1 %: 6 pairs resolve the 3 % threshold (README, "Upgrading torch")."""
        cap = max_pairs if max_pairs is not None else defaults_for(device).ab_max_pairs
        return cls(max_pairs=max(cap, 2), seed=seed)


RunFn = Callable[..., RunRecord]


@dataclass
class ABSession:
    """Measures cases in pairs, A and B alternately, each run in fresh processes."""

    a: Side
    b: Side
    base_dir: Path
    timeout_s: float
    thresholds: Callable[[str], Thresholds]
    schedule: ABSchedule = field(default_factory=ABSchedule)
    run: RunFn = runner.run_once
    on_run: Callable[[str], None] = lambda line: None
    ledgers: dict[str, Ledger] = field(default_factory=dict)
    verdicts: dict[str, ABVerdict] = field(default_factory=dict)
    orders: dict[str, list[str]] = field(default_factory=dict)
    _count: int = 0

    def __post_init__(self) -> None:
        # one id per A/B session and side: fixed ids made every later session's run ids repeat
        # the first's, and the history kept none of them
        stamp = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.ledgers = {"A": Ledger(f"ab-{stamp}-A"), "B": Ledger(f"ab-{stamp}-B")}
        self._rng = random.Random(self.schedule.seed)

    def _order_block(self) -> list[str]:
        block = ["AB", "BA"] * (self.schedule.block // 2)
        self._rng.shuffle(block)
        return block

    def _run(self, side: Side, spec: CaseSpec) -> RunRecord:
        self._count += 1
        run = self.run(
            spec, self.base_dir / f"{spec.case_id}.{side.label}{self._count}", self.timeout_s,
            interpreter=side.interpreter,
        )  # fmt: skip
        fault = injected_fault(side)
        if fault:  # allowed at configure (--perf-inject-faults); every record of it says so
            run = replace(
                run, notes=(*run.notes, f"fault injected on side {side.label}: {FAULT_ENV}={fault}")
            )
        return run

    def measure(self, spec: CaseSpec) -> ABVerdict:
        """Pairs until decided or the cap.

        Raises:
            CaseFailedError: more than ``MAX_DROPPED`` pairs had a failed side.
        """
        sides = {"A": self.a, "B": self.b}
        kept: list[str] = []
        dropped: list[str] = []
        verdict: ABVerdict | None = None
        attempts = 0
        while (
            len(kept) < self.schedule.max_pairs and attempts < self.schedule.max_pairs + 2 * MAX_DROPPED + 4
        ):
            for order in self._order_block():
                if len(kept) >= self.schedule.max_pairs:
                    break  # after a dropped pair the block may not fit under the cap
                attempts += 1
                pair: dict[str, RunRecord] = {}
                failure = None
                for label in order:
                    try:
                        pair[label] = self._run(sides[label], spec)
                    except CaseFailedError as exc:
                        failure = f"pair {attempts} ({order}): side {label} failed: {exc.reason}"
                        break
                if failure is None and any(r.quarantine for r in pair.values()):
                    failure = f"pair {attempts} ({order}): " + "; ".join(
                        f"side {k} {r.quarantine}" for k, r in pair.items() if r.quarantine
                    )
                if failure is not None:
                    dropped.append(failure)  # the other side's run of the pair is dropped too
                    self.on_run(f"{spec.case_id}: {failure}; the pair is dropped")
                    if sum("failed" in d for d in dropped) > MAX_DROPPED:
                        raise CaseFailedError(
                            spec.case_id, None, f"{len(dropped)} A/B pairs failed; last: {failure}"
                        )
                    continue
                for label, result in pair.items():
                    self.ledgers[label].add(spec, result)
                kept.append(order)
            if len(kept) >= self.schedule.min_pairs:
                verdict = self._judge(spec, kept, dropped)
                decided = not undecided(verdict)
                more = "" if decided or len(kept) >= self.schedule.max_pairs else "; more pairs"
                self.on_run(f"{spec.case_id}: {len(kept)} pairs: {verdict.status}{more}")
                if decided:
                    break
        if verdict is None:
            if any("failed" in d for d in dropped):
                raise CaseFailedError(spec.case_id, None, "no A/B pair completed: " + "; ".join(dropped[-3:]))
            # every pair disturbed (a busy machine): not judged, as the suite calls a case whose
            # every run was disturbed -- NOISY, exit 0 -- never REGRESSED's exit 1
            verdict = ABVerdict(
                spec.case_id, Status.NOISY,
                f"{spec.case_id} NOISY: {len(kept)} of {self.schedule.min_pairs} pairs needed were "
                f"undisturbed ({len(dropped)} dropped; last: {dropped[-1] if dropped else 'none'}): "
                "not judged; run it again on a quiet machine",
                orders=tuple(kept), dropped=tuple(dropped),
            )  # fmt: skip
        for ledger in self.ledgers.values():
            if spec.case_id in ledger.records:  # a NOISY case may have kept no pair
                ledger.complete(spec.case_id)
        self.verdicts[spec.case_id] = verdict
        return verdict

    def _footprint(self, spec: CaseSpec, mem: tuple[list[float], list[float]]) -> str:
        """On CPU, how much of a peak-memory change importing torch alone makes (measured
        when each side was probed): a CUDA build maps far larger libraries than a CPU build
        (228 vs 506 MiB for 2.13.0+cpu vs 2.14.1+cu130 on the 2-core VM), which is the
        installs' difference, not the training step's. Empty when it is not material."""
        a_import, b_import = (side.versions.get("import_rss_bytes") for side in (self.a, self.b))
        if spec.device != "cpu" or not isinstance(a_import, int) or not isinstance(b_import, int):
            return ""
        grown = float(np.mean(mem[1]) - np.mean(mem[0]))
        by_import = float(b_import - a_import)
        if grown == 0 or by_import / grown < 0.25:
            return ""
        mib = 1024.0**2
        return (
            f"; importing torch alone: {a_import / mib:.0f} -> {b_import / mib:.0f} MiB, "
            f"{by_import / mib:+.0f} of the {grown / mib:+.0f} MiB: the installs' libraries"
        )

    def _judge(self, spec: CaseSpec, kept: list[str], dropped: list[str]) -> ABVerdict:
        ev_a = self.ledgers["A"].evidence(spec.case_id)
        ev_b = self.ledgers["B"].evidence(spec.case_id)
        a_runs, b_runs = ev_a.runs, ev_b.runs
        thr = self.thresholds(spec.case_id)
        eff = None
        if spec.world_size > 1 and all(r.scaling_efficiency is not None for r in (*a_runs, *b_runs)):
            eff = (
                [r.scaling_efficiency or 0.0 for r in a_runs],
                [r.scaling_efficiency or 0.0 for r in b_runs],
            )
        mem = ([float(r.peak_mem_bytes) for r in a_runs], [float(r.peak_mem_bytes) for r in b_runs])
        status, step, effs, mems, reasons = decide_pairs(
            spec.case_id, [r.median_s for r in a_runs], [r.median_s for r in b_runs], thr, eff, mem
        )
        metrics = metric_verdicts(step, effs, mems, thr)
        ab, ba = kept.count("AB"), kept.count("BA")
        p = step.p_up if step.change >= 0 else step.p_down
        b_ms, a_ms = ev_b.median_s() * 1e3, ev_a.median_s() * 1e3
        parts = [
            f"step {b_ms:.1f} ms (B) vs {a_ms:.1f} ms (A) ({step.change:+.1%}, "
            f"95% CI [{step.ci[0]:+.1%}, {step.ci[1]:+.1%}]; {step.n} pairs ({ab} AB, {ba} BA), "
            f"pair spread {step.spread:.1%}, p={p:.1g})"
        ]
        if effs is not None and eff is not None:
            label = " (scaling regression)" if "efficiency" in reasons else ""
            parts.append(f"efficiency {np.mean(eff[0]):.2f} (A) -> {np.mean(eff[1]):.2f} (B){label}")
        if mems is not None:
            parts.append(f"peak memory {mems.change:+.1%} ({metrics['memory']}{self._footprint(spec, mem)})")
        parts.append("verdicts: " + ", ".join(f"{m} {v}" for m, v in metrics.items()))
        if status is Status.INCONCLUSIVE or Status.INCONCLUSIVE in metrics.values():
            left = [m for m, v in metrics.items() if v is Status.INCONCLUSIVE]
            parts.append(
                f"{', '.join(left)} undecided after {step.n} pairs (the cap is {self.schedule.max_pairs})"
            )
        if dropped:
            parts.append(f"{len(dropped)} pair(s) dropped: {dropped[0]}")
        parts += [
            f"fault injected on side {side.label}: {FAULT_ENV}={fault} (--perf-inject-faults)"
            for side in (self.a, self.b)
            if (fault := injected_fault(side))
        ]
        story = (
            f"{spec.case_id} {status}: " + "; ".join(parts)
            + f"; torch {self.a.versions.get('torch')} (A) -> {self.b.versions.get('torch')} (B)"
        )  # fmt: skip
        return ABVerdict(spec.case_id, status, story, step, effs, mems, tuple(kept), tuple(dropped), metrics)
