"""What the parent and the rest of the package know of rank processes, without importing torch:
the error a case that could not produce a result raises, and the interpreter ranks start with.

The scheduler (local pools, Slurm steps, paired A/B) and the plugin catch ``CaseFailedError``
and name ``Interpreter`` through this module, so none of them pulls in the worker (torch) to
say that a case failed.
"""

from __future__ import annotations

from dataclasses import dataclass


class CaseFailedError(RuntimeError):
    """A case could not produce a result; the message names the case, the rank and why."""

    def __init__(self, case_id: str, rank: int | None, reason: str, detail: str = "") -> None:
        self.case_id = case_id
        self.rank = rank
        self.reason = reason
        self.detail = detail
        who = f"rank {rank}" if rank is not None else "all ranks"
        text = f"{case_id}: {who}: {reason}"
        super().__init__(f"{text}\n{detail}".rstrip())


@dataclass(frozen=True)
class Interpreter:
    """The Python that runs the ranks (another virtual environment, for paired A/B runs), and
    environment variables set for its ranks only."""

    python: str
    env: tuple[tuple[str, str], ...] = ()
    # a cluster's side: srun arguments of its steps only (its container image); the python is
    # then a path inside that container, probed inside a step
    srun_args: tuple[str, ...] = ()
