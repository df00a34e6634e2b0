"""Baselines on disk: one versioned JSON file per hardware fingerprint; per case and torch
version, the last K accepted runs.

File ``baselines/<hardware key>.json`` (schema 2)::

    {"schema_version": 2, "hardware_key": "cuda-nvidia-h200-x1", "hardware": {...},
     "cases": {"<case id>": {"<torch version>": {<CaseEvidence: config, versions, runs>}}}}

The hardware key holds what makes numbers incomparable: the device model and count for CUDA
(NCCL), the CPU model and threads per rank for CPU (gloo). Files are parsed as JSON data only
and validated field by field; a file that cannot be used is reported and never rewritten.
Updates take an exclusive lock, re-read the file and merge into what is there *now*, so two
sessions updating one file both keep their entries.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import stat
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaleguard.evidence.files import Fields, FileFormatError, atomic_write_text, read_document
from scaleguard.evidence.runs import CaseEvidence
from scaleguard.machine.env import HostFingerprint, slug
from scaleguard.schema import SCHEMA_VERSION

_TOP_FIELDS = frozenset({"schema_version", "hardware_key", "hardware", "cases"})
DEFAULT_KEEP_RUNS = 10
LOCK_TIMEOUT_S = 120.0
_FIX = "restore it from version control (git checkout -- FILE) or move it aside to record a new one"


class BaselineError(RuntimeError):
    """A baseline file exists but cannot be used; the message names the file and the fix."""


# a hardware key names a file in the baselines directory: no separators, no "..", no hidden file
_KEY = re.compile(r"[a-z0-9][a-z0-9._-]{0,150}")


def check_key(key: str, what: str = "hardware key") -> str:
    """``key`` if it is a plain file name stem (what ``slug`` produces), else FileFormatError."""
    if not _KEY.fullmatch(key) or ".." in key:
        raise FileFormatError(
            f"{what} {key[:60]!r} is not a hardware key: lower-case letters, digits, '.', '_' and '-', "
            "as `scaleguard hardware-key` prints"
        )
    return key


def hardware_key(
    device: str, gpu_name: str | None, gpu_count: int, cpu_model: str, threads_per_rank: int
) -> str:
    """``cuda-<gpu model>-x<count>`` or ``cpu-<cpu model>-<threads per rank>t``."""
    if device == "cuda":
        return f"cuda-{slug(gpu_name or 'unknown-gpu')}-x{gpu_count}"
    return f"cpu-{slug(cpu_model)}-{threads_per_rank}t"


def host_hardware_key(host: HostFingerprint, device: str, threads_per_rank: int) -> str:
    return hardware_key(device, host.gpu_name, host.gpu_count, host.cpu_model, threads_per_rank)


@dataclass
class BaselineFile:
    path: Path
    hardware_key: str
    hardware: dict[str, Any]
    cases: dict[str, dict[str, CaseEvidence]] = field(default_factory=dict)
    migrated_from: int | None = None  # schema of the file on disk, when older than ours

    def entry(self, case_id: str, torch_version: str | None) -> CaseEvidence | None:
        """The entry for ``case_id``: of ``torch_version`` if given, else the newest recorded."""
        by_torch = self.cases.get(case_id, {})
        if torch_version is not None:
            return by_torch.get(torch_version)
        if not by_torch:
            return None
        return max(by_torch.values(), key=lambda e: max(r.recorded_at for r in e.runs))

    def merged(
        self,
        additions: Iterable[CaseEvidence],
        restart: frozenset[str] = frozenset(),
        keep: int = DEFAULT_KEEP_RUNS,
    ) -> BaselineFile:
        """A copy with ``additions``' runs appended per case and torch version (the oldest
        dropped beyond ``keep``); other cases and torch versions untouched.

        An entry starts afresh (its old runs dropped) when the configuration changed or the case
        is in ``restart`` (a deliberate new level: an accepted regression, a real improvement).
        """
        cases = {cid: dict(by_torch) for cid, by_torch in self.cases.items()}
        for add in additions:
            by_torch = cases.setdefault(add.case_id, {})
            old = by_torch.get(add.torch)
            runs = list(add.runs)
            if old is not None and old.config == add.config and add.case_id not in restart:
                seen = {r.run_id for r in add.runs}
                runs = [r for r in old.runs if r.run_id not in seen] + runs
            by_torch[add.torch] = add.with_runs(runs[-keep:])
        return BaselineFile(self.path, self.hardware_key, self.hardware, cases)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "hardware_key": self.hardware_key,
            "hardware": self.hardware,
            "cases": {
                cid: {tv: entry.to_dict() for tv, entry in sorted(by_torch.items())}
                for cid, by_torch in sorted(self.cases.items())
            },
        }

    def to_text(self) -> str:
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False)
        # one line per sample list: a 10-run baseline stays reviewable in a diff
        return (
            re.sub(
                r"\[\s+((?:-?[\d.e+-]+,\s+)*-?[\d.e+-]+)\s+\]",
                lambda m: "[" + ", ".join(m.group(1).split()).replace(",,", ",") + "]",
                text,
            )
            + "\n"
        )


def load(path: Path) -> BaselineFile | None:
    """Read and validate a baseline file; ``None`` when there is none. Schema 1 loads as one
    run per entry (``migrated_from`` says so; older schemas too) and is written back in the current
    schema on update.

    Raises:
        BaselineError: the file is unreadable, not JSON, of another schema, or malformed.
    """
    if not os.path.lexists(path):
        return None
    fix = _FIX.replace("FILE", str(path))
    try:
        return _from_data(path, read_document(path, "baseline", fix), fix)
    except FileFormatError as exc:
        raise BaselineError(str(exc)) from None


def _from_data(path: Path, data: dict[str, Any], fix: str) -> BaselineFile:
    top = Fields.of(data, f"baseline {path}", fix).known(_TOP_FIELDS)
    version = top.integer("schema_version", 1, SCHEMA_VERSION)
    key = check_key(top.string("hardware_key"), f"baseline {path}: hardware_key")
    cases: dict[str, dict[str, CaseEvidence]] = {}
    all_cases = top.obj("cases")
    for case_id in all_cases.data:
        Fields({"case": case_id}, f"baseline {path}, cases", fix).ident("case")
        by_torch = all_cases.obj(case_id)
        cases[case_id] = {}
        for torch_version, raw in by_torch.data.items():
            Fields({"torch": torch_version}, f"baseline {path}, case {case_id}", fix).ident("torch")
            where = f"baseline {path}, case {case_id}, torch {torch_version}"
            entry = (
                CaseEvidence.from_schema1(raw, where, fix)
                if version == 1
                else CaseEvidence.from_dict(raw, where, fix)
            )
            if entry.case_id != case_id:
                raise FileFormatError(f"{where}: holds case {entry.case_id!r}; {fix}")
            cases[case_id][torch_version] = entry
    return BaselineFile(
        path,
        key,
        top.scalars("hardware"),
        cases,
        migrated_from=version if version != SCHEMA_VERSION else None,
    )


def check_matches(
    loaded: BaselineFile | None, hardware_key: str, torch_pick: str | None, option: str
) -> None:
    """The file found for this hardware is this hardware's, and holds the torch version asked
    for: otherwise every case would read NEW and the gate would open without a word."""
    if loaded is None:
        if torch_pick is not None:
            raise BaselineError(f"{option} {torch_pick}: there is no baseline file for {hardware_key} yet")
        return
    if loaded.hardware_key != hardware_key:
        raise BaselineError(
            f"baseline {loaded.path} holds hardware_key {loaded.hardware_key!r} but is named for "
            f"{hardware_key!r}: a file renamed or copied from another machine is not compared; "
            "restore its name or move it aside"
        )
    if torch_pick is not None:
        present = sorted({tv for by_torch in loaded.cases.values() for tv in by_torch})
        if torch_pick not in present:
            raise BaselineError(
                f"{option} {torch_pick}: {loaded.path} has no entries for it; "
                f"torch versions present: {', '.join(present) or 'none'}"
            )


def checked_text(baseline: BaselineFile) -> str:
    """The file's text, read back through the same validation a reader applies: nothing is
    written that ``load`` would refuse (a step of 1e308 s, a NaN, an id with a newline)."""
    try:
        text = baseline.to_text()
        _from_data(baseline.path, json.loads(text), "a scaleguard bug: report it")
    except (ValueError, FileFormatError) as exc:
        raise BaselineError(f"baseline {baseline.path}: not written, it would not read back: {exc}") from None
    return text


def _lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


def _open_lock(path: Path) -> int:
    """The lock file's descriptor, opened safely: read-only is enough for flock (another
    user's 0644 lock still locks); O_NOFOLLOW refuses a link planted at the lock path instead
    of creating its target; a directory or a device there is refused."""
    lock_path = _lock_path(path)
    flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, flags, 0o666)
    except OSError as exc:
        why = "is a symbolic link" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
        raise BaselineError(
            f"baseline {path}: its lock file {lock_path} cannot be used ({why}); nothing was written. "
            "Remove it, or pass another baselines directory."
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BaselineError(
            f"baseline {path}: its lock file {lock_path} is not a regular file; nothing was written. "
            "Remove it."
        )
    return fd


def check_lock(path: Path) -> None:
    """Fail before measuring when the lock of ``path`` could never be taken."""
    os.close(_open_lock(path))


@contextlib.contextmanager
def locked(path: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Exclusive lock for updating ``path``: a sidecar ``.lock`` file (the baseline itself is
    replaced by rename, so a lock on its inode would not exclude the next writer)."""
    fd = _open_lock(path)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    raise BaselineError(
                        f"baseline {path}: another scaleguard session has held {_lock_path(path).name} "
                        f"for {timeout_s:.0f} s; nothing was written. Run the update again when it ends."
                    ) from None
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def update(
    path: Path,
    hardware_key: str,
    hardware: dict[str, Any],
    additions: list[CaseEvidence],
    restart: frozenset[str] = frozenset(),
    keep: int = DEFAULT_KEEP_RUNS,
) -> BaselineFile:
    """Merge ``additions`` into the file as it is on disk now, under the lock, atomically."""
    with locked(path):
        current = load(path)
        if current is not None and current.hardware_key != hardware_key:
            raise BaselineError(
                f"{path} holds hardware {current.hardware_key}, this is {hardware_key}: "
                "not overwritten; move it aside first"
            )
        if current is None:
            current = BaselineFile(path, hardware_key, dict(hardware))
        merged = current.merged(additions, restart, keep)
        atomic_write_text(path, checked_text(merged))
        return merged


def check_writable(directory: Path) -> None:
    """Fail now, not after an hour of measuring, when the baseline cannot be written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".scaleguard-write-test-{os.getpid()}"
        probe.write_bytes(b"x" * 4096)
        probe.unlink()
    except OSError as exc:
        raise BaselineError(
            f"baselines directory {directory} is not writable ({exc.strerror or exc}); "
            "fix its permissions or free space, or pass --perf-baselines DIR"
        ) from None


def git_root(cwd: Path) -> Path | None:
    """The repository ``cwd`` is in (None outside one): its name is a history's default project."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=cwd, capture_output=True, text=True, timeout=10,
            check=True,
        )  # fmt: skip
    except (subprocess.SubprocessError, OSError):
        return None
    return Path(out.stdout.strip()) if out.stdout.strip() else None


def git_commit(cwd: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (subprocess.SubprocessError, OSError):
        return None
    return out.stdout.strip() or None
