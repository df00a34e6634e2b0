"""The ``Workload`` contract: the one way a case gets its model, its batches and its step.

A workload says what to build and how one rank trains it; the harness owns everything else
(devices, wrapping for ddp/fsdp/compile, timing, the anatomy, records). Built-in models
(``scaleguard.workloads.builtins``) are workloads through this same interface, and a team's own training
step plugs in here without a fork::

    # mypkg/perf.py
    from scaleguard.workloads.contract import Workload

    class MyModel(Workload):
        name = "mymodel"
        strong_global_batch, weak_per_rank_batch = 64, 16
        def build(self): return MyNet()
        def synthetic_batch(self, batch, generator):
            x = torch.randn(batch, 128, generator=generator)
            return x, torch.randint(0, 10, (batch,), generator=generator)

    pytest perf/ --perf-workloads mypkg.perf:MyModel

A workload is named by an import path (``package.module:attribute``), never passed as an
object: spawned ranks, pooled ranks, the other interpreter of ``scaleguard ab`` and torchrun
ranks all import it themselves, so nothing closes over the parent's state.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from scaleguard.case import WORKLOAD_REF

Batch = tuple[torch.Tensor, ...]
ENTRY_POINT_GROUP = "scaleguard.workloads"
_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
REF = WORKLOAD_REF
NAME = re.compile(r"[A-Za-z0-9_]{1,48}")


class WorkloadError(ValueError):
    """A workload that cannot be used; the message names it and says what is wrong."""


class Workload:
    """One training workload. Subclass it, set the class attributes, override what differs.

    Class attributes:
        name: the model part of case ids (letters, digits, '_').
        strong_global_batch / weak_per_rank_batch: batch of strong scaling (split over ranks)
            and of weak scaling (per device).
        sample: what one sample is, for throughput ("images", "sequences", "samples").
        tokens_per_sample: tokens in one sample (> 0: tokens/s is reported).
        modes, precisions, scalings, inputs: what the workload supports; the matrix asks only
            for these (``inputs`` may include "loader" when ``loader_batches`` is implemented).
        channels_last: on CUDA, model and synthetic inputs in channels_last (conv nets).
        profiles: where it runs by default: "smoke" (CPU-sized) and/or "full" (GPU-sized).
    """

    name: str = ""
    strong_global_batch: int = 0
    weak_per_rank_batch: int = 0
    sample: str = "samples"
    tokens_per_sample: int = 0
    modes: tuple[str, ...] = ("single", "dp", "ddp", "fsdp", "compile")
    precisions: tuple[str, ...] = ("fp32", "bf16")
    scalings: tuple[str, ...] = ("strong", "weak")
    inputs: tuple[str, ...] = ("synthetic",)
    channels_last: bool = False
    profiles: tuple[str, ...] = ("smoke", "full")
    # collectives time one all-reduce of this many bytes per step, no model (scaleguard.ranks.collective)
    message_bytes: int = 0
    image_px: int = 0  # image workloads: square input side (the loader's FakeData)

    @property
    def is_collective(self) -> bool:
        return self.message_bytes > 0

    def build(self) -> nn.Module:
        """The model, on the host; the harness moves it to the rank's device and wraps it.

        Also called once under ``torch.device("meta")`` to count FLOPs without memory: keep it
        free of side effects; a build that needs real values there (``.item()``, a checkpoint)
        is counted on the device instead."""
        raise NotImplementedError(f"workload {self.name}: build() is not implemented")

    def synthetic_batch(self, batch: int, generator: torch.Generator) -> Batch:
        """One random batch of ``batch`` samples, made on the host from ``generator``."""
        raise NotImplementedError(f"workload {self.name}: synthetic_batch() is not implemented")

    def loader_batches(
        self, batch: int, device: torch.device, rank: int, world: int, seed: int, workers: int,
        data_root: str | None,
    ) -> Iterator[Batch]:  # fmt: skip
        """Batches through the real input pipeline (``inputs`` must list "loader")."""
        raise NotImplementedError(f"workload {self.name}: has no loader input pipeline")

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """The scalar loss of one batch (default: cross-entropy of ``model(inputs)``)."""
        inputs, targets = batch[0], batch[1]
        return nn.functional.cross_entropy(model(inputs), targets)

    def optimizer(self, params: Sequence[nn.Parameter] | Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=1e-4)

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        """Submodules FSDP2 shards on their own (transformer blocks); the root always is."""
        return []

    def flops_per_sample(self) -> float | None:
        """A formula for training FLOPs per sample (forward + backward) that wins over the
        count; None: counted once with ``torch.utils.flop_counter.FlopCounterMode``."""
        return None

    def flops_source(self) -> str:
        return f"{type(self).__name__}.flops_per_sample" if self.flops_per_sample() else "FlopCounterMode"


IMPORT_TIMEOUT_S = 60.0  # a user's module that sleeps or waits at import must not hang collection
_MISSING = object()


class _Expired(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: float, what: str) -> Iterator[None]:
    """Raise WorkloadError if the block runs past ``seconds`` (SIGALRM: the main thread only,
    where pytest collects; elsewhere the block runs unbounded)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise _Expired

    previous = signal.signal(signal.SIGALRM, expire)
    # an alarm already set (pytest-timeout's signal method uses SIGALRM too) keeps running:
    # ours never outlasts it, and it is re-armed with what is left of it afterwards
    outer, _ = signal.getitimer(signal.ITIMER_REAL)
    started = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, min(seconds, outer) if outer > 0 else seconds)
    try:
        yield
    except _Expired:
        if outer > 0 and outer <= seconds:
            previous_handler = previous if callable(previous) else None
            if previous_handler is not None:  # the outer deadline came first: its handler decides
                previous_handler(signal.SIGALRM, None)
        raise WorkloadError(
            f"{what} did not finish importing within {seconds:g} s (does it wait at import?)"
        ) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer > 0:
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, outer - (time.monotonic() - started)))


def _what(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r}) (argument parsing, or a script's main, at import?)"
    return f"{type(exc).__name__}: {exc}"


def check(workload: Any, where: str) -> Workload:
    """``workload`` as a usable Workload instance, or WorkloadError naming what is wrong."""
    try:
        return _check(workload, where)
    except WorkloadError:
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a user's class: a raising property too
        raise WorkloadError(f"{where}: using it raised {_what(exc)}") from None


def _check(workload: Any, where: str) -> Workload:
    if isinstance(workload, type) and issubclass(workload, Workload):
        try:
            workload = workload()
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a user's constructor: any failure is theirs
            raise WorkloadError(f"{where}: constructing it raised {_what(exc)}") from None
    if not isinstance(workload, Workload):
        raise WorkloadError(
            f"{where} is a {type(workload).__name__}, not a scaleguard.workload.Workload (subclass it)"
        )
    name = workload.name
    if not isinstance(name, str) or not NAME.fullmatch(name or ""):
        raise WorkloadError(f"{where}: name {str(name)[:60]!r} must be 1-48 letters, digits or '_'")
    if not workload.is_collective:
        for attr in ("strong_global_batch", "weak_per_rank_batch"):
            value = getattr(workload, attr)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**20:
                raise WorkloadError(
                    f"workload {workload.name} ({where}): {attr} must be a positive integer, got {value!r}"
                )
    for attr, allowed in (
        ("modes", ("single", "dp", "ddp", "fsdp", "compile")),
        ("precisions", ("fp32", "bf16")),
        ("scalings", ("strong", "weak")),
        ("inputs", ("synthetic", "loader")),
        ("profiles", ("smoke", "full")),
    ):
        value = getattr(workload, attr)
        if not value or any(v not in allowed for v in value):
            raise WorkloadError(
                f"workload {workload.name} ({where}): {attr} {value!r} must list some of {', '.join(allowed)}"
            )
    return workload


def load_path(path: str) -> list[Workload]:
    """The workloads at ``package.module:attribute`` (one workload, its class, or a list)."""
    if not _PATH.fullmatch(path):
        raise WorkloadError(f"workload {path!r}: expected package.module:attribute")
    module_name, attr = path.split(":")
    try:
        with _deadline(IMPORT_TIMEOUT_S, f"workload {path}: module {module_name}"):
            module = importlib.import_module(module_name)
            value = getattr(module, attr, _MISSING)
    except WorkloadError:
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a user's module: any failure, sys.exit too
        raise WorkloadError(f"workload {path}: module {module_name} does not import ({_what(exc)})") from None
    if value is _MISSING:
        raise WorkloadError(f"workload {path}: module {module_name} has no attribute {attr!r}")
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise WorkloadError(f"workload {path}: the list is empty")
    return [
        check(item, f"workload {path}" + (f"[{i}]" if len(items) > 1 else "")) for i, item in enumerate(items)
    ]


def entry_point_paths() -> list[str]:
    """``module:attr`` of every installed package's ``scaleguard.workloads`` entry point."""
    from importlib.metadata import entry_points

    return [ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)]
