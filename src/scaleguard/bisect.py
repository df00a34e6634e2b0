"""``scaleguard bisect PY_GOOD PY_2 ... PY_BAD -- perf/ -k CASE``: the first bad torch build.

Given interpreters ordered oldest-good first and newest-bad last (one virtual environment per
build), binary search with the paired A/B of ``scaleguard.ab`` at each probe, always against the
good end: a probe whose selected cases read REGRESSED is bad, one that reads SAME or IMPROVED is
good. An INCONCLUSIVE probe is said and the search stops there, with the range still open: a
build is never guessed. The bad end is probed first, so a regression that does not reproduce is
"not found" before any build in between is spent. As TorchBench's ``bisection.py`` and
``asv find`` do, only ``log2(n)`` builds are measured.

Exit 0: found; 1: not found or undecidable; 2: bad input.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scaleguard import ab


@dataclass(frozen=True)
class Probe:
    index: int
    status: str  # REGRESSED / IMPROVED / SAME / INCONCLUSIVE / FAILED
    stories: tuple[str, ...]


def probe_build(good: str, build: str, pytest_args: list[str], index: int, work: Path) -> Probe:
    """One paired A/B session of ``build`` against ``good`` over the selected cases."""
    storage = work / f"probe{index}"
    command = [sys.executable, "-m", "pytest", *pytest_args, "-p", "no:cacheprovider", "-q",
               "--perf-ab-a", good, "--perf-ab-b", build, "--perf-no-history",
               f"--benchmark-save=probe{index}", f"--benchmark-storage=file://{storage}"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    saved = sorted(storage.glob(f"*/*_probe{index}.json"))
    if done.returncode not in (0, 1) or not saved:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        return Probe(index, "FAILED", (f"pytest exited {done.returncode}: " + " | ".join(tail),))
    infos = [b.get("extra_info", {}) for b in json.loads(saved[-1].read_text()).get("benchmarks", [])]
    statuses = [str(i.get("ab_verdict")) for i in infos if i.get("ab_verdict")]
    stories = tuple(str(i.get("ab_story")) for i in infos if i.get("ab_story"))
    if not statuses:
        return Probe(index, "FAILED", ("no case was measured: check the selection (-k)",))
    if "REGRESSED" in statuses:
        status = "REGRESSED"
    elif "INCONCLUSIVE" in statuses:
        status = "INCONCLUSIVE"
    elif all(s in ("SAME", "IMPROVED") for s in statuses):
        status = "SAME"
    else:
        status = "FAILED"
    return Probe(index, status, stories)


def main(builds: list[str], pytest_args: list[str], out: Callable[[str], None] = print) -> int:
    """Binary search over ``builds`` (interpreters, good first, bad last)."""
    say = out
    if len(builds) < 2:
        say("scaleguard bisect: give at least the good and the bad interpreter, oldest first")
        return 2
    try:
        sides = [ab.probe(f"build {i}", b) for i, b in enumerate(builds)]
    except ab.ABInputError as exc:
        say(f"scaleguard bisect: {exc}")
        return 2
    for i, side in enumerate(sides):
        say(f"build {i}: {builds[i]} -> {side.interpreter.python} ({_build(side)})")
    good = sides[0].interpreter.python
    lo, hi = 0, len(builds) - 1
    with tempfile.TemporaryDirectory(prefix="scaleguard-bisect-") as tmp:
        work = Path(tmp)

        def measure(index: int) -> Probe:
            result = probe_build(good, sides[index].interpreter.python, pytest_args, index, work)
            say(f"probe build {index} ({builds[index]}) against build 0: {result.status}")
            for story in result.stories:
                say(f"  {story}")
            return result

        last = measure(hi)
        if last.status != "REGRESSED":
            say(f"not found: the bad end ({builds[hi]}) reads {last.status} against the good end")
            return 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            result = measure(mid)
            if result.status == "REGRESSED":
                hi = mid
            elif result.status == "SAME":
                lo = mid
            else:
                say(
                    f"undecidable: build {mid} ({builds[mid]}) reads {result.status}; the first bad build "
                    f"is among builds {lo + 1}..{hi} ({builds[lo + 1]} .. {builds[hi]}): not guessed"
                )
                return 1
    say(f"first bad: {builds[hi]} ({_build(sides[hi])}); last good: {builds[lo]} ({_build(sides[lo])})")
    return 0


def _build(side: ab.Side) -> str:
    return f"torch {side.versions.get('torch')}, git {side.versions.get('git') or '?'}"
