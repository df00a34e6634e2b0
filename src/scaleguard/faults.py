"""Deliberate faults for testing the harness the way real runs fail.

Set ``SCALEGUARD_INJECT_FAULT`` before a run, e.g. ``raise,rank=1,phase=measure,step=2``.
Kinds: ``raise`` (a Python error), ``sigkill`` (as the OOM killer would), ``hang`` (SIGSTOP:
the rank stops answering), ``exit0`` (exits cleanly without a result), ``nan`` (the loss turns
non-finite), ``oom`` (a real out-of-memory on CUDA, a simulated one on CPU), and ``commdelay``
(DDP all-reduce delayed by ``ms`` per bucket on world sizes > 1: a communication regression).
The variable is read only inside ranks; nothing is injected unless it is set.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass

import torch

FAULT_ENV = "SCALEGUARD_INJECT_FAULT"
KINDS = ("raise", "sigkill", "hang", "exit0", "nan", "oom", "commdelay")


class InjectedFault(RuntimeError):
    """Raised by the ``raise`` fault."""


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    rank: int | None = None  # None: every rank
    phase: str = "measure"  # "setup", "warmup" or "measure"
    step: int = 0
    ms: float = 0.0

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        kind, *pairs = [p.strip() for p in text.split(",") if p.strip()]
        if kind not in KINDS:
            raise ValueError(f"{FAULT_ENV}: unknown fault {kind!r}; known: {', '.join(KINDS)}")
        values: dict[str, str] = {}
        for pair in pairs:
            key, _, value = pair.partition("=")
            values[key] = value
        unknown = set(values) - {"rank", "phase", "step", "ms"}
        if unknown:
            raise ValueError(f"{FAULT_ENV}: unknown keys {sorted(unknown)}")
        return cls(
            kind=kind,
            rank=int(values["rank"]) if "rank" in values else None,
            phase=values.get("phase", "measure"),
            step=int(values.get("step", 0)),
            ms=float(values.get("ms", 0.0)),
        )

    @classmethod
    def from_env(cls) -> FaultSpec | None:
        text = os.environ.get(FAULT_ENV, "").strip()
        return cls.parse(text) if text else None

    def applies(self, rank: int, phase: str, step: int) -> bool:
        return (self.rank is None or self.rank == rank) and self.phase == phase and self.step == step

    def fire(self, device: torch.device) -> None:
        """Cause the fault now. ``nan`` and ``commdelay`` act elsewhere and do nothing here."""
        if self.kind == "raise":
            raise InjectedFault(f"injected fault ({FAULT_ENV}={self})")
        if self.kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "hang":
            os.kill(os.getpid(), signal.SIGSTOP)
        if self.kind == "exit0":
            sys.stdout.flush()
            os._exit(0)  # no result file, no cleanup: what a careless wrapper script might do
        if self.kind == "oom":
            if device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(device)
                torch.empty(free * 2, dtype=torch.uint8, device=device)  # a real CUDA OOM
            raise torch.OutOfMemoryError(f"injected: CPU out of memory (simulated, {FAULT_ENV}={self})")
