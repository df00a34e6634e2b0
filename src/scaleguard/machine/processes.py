"""Stopping the process groups this package starts: rank processes, srun, a probed interpreter, a
bisect probe's pytest. One way for every caller: each signal of a sequence goes to every group,
the leaders get one shared grace period to exit, and SIGKILL goes to every group at the end
whatever happened (a leader that exited may leave children in its group: loader workers, a
rank's threads' helpers), then the leaders are reaped with a deadline.

The sequence says how a process likes to be asked: ranks get SIGTERM (their handler writes why
they stopped), ``srun`` and ``pytest`` get SIGINT (srun cancels its step on it; pytest unwinds and
reaps its own ranks).

Also here: starting a helper with multiprocessing's spawn without the parent's ``__main__``
(``spawning_without_main``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from multiprocessing.process import BaseProcess
from typing import Any

Child = subprocess.Popen[Any] | BaseProcess
REAP_DEADLINE_S = 10.0


def signal_group(child: Child, sig: signal.Signals) -> None:
    """``sig`` to the group ``child`` leads; to ``child`` alone when it made no group of its own
    (and only while it lives: a reaped child's pid may be another process's by now)."""
    if child.pid is None:
        return
    try:
        os.killpg(child.pid, sig)
        return
    except (ProcessLookupError, PermissionError):
        pass  # not (yet) a group leader, or the group is gone
    if not _exited(child):
        try:
            os.kill(child.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _exited(child: Child) -> bool:
    if isinstance(child, subprocess.Popen):
        return child.poll() is not None
    return child.exitcode is not None


def _wait(child: Child, timeout_s: float) -> None:
    if isinstance(child, subprocess.Popen):
        try:
            child.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            pass
    else:
        child.join(timeout=max(0.0, timeout_s))


def stop_groups(children: Sequence[Child], sequence: Sequence[tuple[signal.Signals, float]]) -> None:
    """Ask, then make sure: each ``(signal, grace_s)`` of ``sequence`` to every group still led
    by a live process, waiting at most ``grace_s`` for all of them together; then SIGKILL to
    every group, and reap. A Ctrl-C during a grace period cuts it short; the SIGKILL and the
    reaping happen whatever happens."""
    try:
        for sig, grace_s in sequence:
            live = [c for c in children if not _exited(c)]
            if not live:
                break
            for child in live:
                signal_group(child, sig)
            deadline = time.monotonic() + grace_s
            for child in live:
                _wait(child, deadline - time.monotonic())
    finally:
        for child in children:
            signal_group(child, signal.SIGKILL)
        deadline = time.monotonic() + REAP_DEADLINE_S
        for child in children:
            _wait(child, deadline - time.monotonic())


def stop_group(child: Child, sequence: Sequence[tuple[signal.Signals, float]]) -> None:
    stop_groups([child], sequence)


@contextlib.contextmanager
def spawning_without_main() -> Iterator[None]:
    """Processes spawned inside start without re-running the parent's ``__main__``: spawn
    imports the main module of the parent in each child, and a user's script that calls
    scaleguard without an ``if __name__ == "__main__"`` guard would run again in every helper
    (measured: a script timing a history view read the whole history again in its search
    worker, which then failed to start its own). A helper's target lives in a module of ours."""
    from multiprocessing import spawn

    saved = spawn.get_preparation_data

    def without_main(name: str) -> dict[str, Any]:
        data = saved(name)
        data.pop("init_main_from_name", None)
        data.pop("init_main_from_path", None)
        return data

    spawn.get_preparation_data = without_main  # type: ignore[assignment]
    try:
        yield
    finally:
        spawn.get_preparation_data = saved  # type: ignore[assignment]
