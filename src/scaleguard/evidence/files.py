"""Every file scaleguard reads or writes, at the leaf: the one validating reader and atomic writes.

Every file kind (rank files, torchrun run records, Slurm job records, baselines, saved
pytest-benchmark runs) goes through ``read_document`` and ``Fields``: bounded bytes and
containers, types, finite positive samples; a violation is a ``FileFormatError`` naming the file,
the field and the fix, never a traceback. Writes are atomic (``atomic_write_text``).

This module imports only ``schema``: ``case`` and every layer above read through it.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar

from scaleguard.schema import READABLE_VERSIONS, SCHEMA_VERSION

MAX_FILE_BYTES = 64 * 2**20  # a baseline of 10 runs x 100 cases is ~10 MB
MAX_SAMPLES = 100_000  # per-step samples in one run
MAX_ITEMS = 10_000  # cases in a file, runs in an entry, ranks in a run
# what one file may hold before it is parsed: Python objects cost ~26x the JSON text of
# `[{},{},...]`, so the byte cap alone does not bound memory. The committed CPU baseline
# (340 kB, 10 runs x 16 cases) has 1,828 containers and 10,526 separators.
MAX_CONTAINERS = 200_000  # '{' plus '[' (a bound: braces inside strings count too)
MAX_SEPARATORS = 4_000_000  # ','; 4 M floats are ~130 MB, two caps' worth
MAX_STEP_S = 1e6  # one training step longer than 11 days is not a measurement
MAX_ID_CHARS = 200
# case ids, group ids and torch versions are printed in tables, markdown and file names:
# printable, no whitespace (a newline would inject a markdown row)
_ID = re.compile(rf"[!-~]{{1,{MAX_ID_CHARS}}}")
ID_PATTERN = _ID  # for readers of other stores (the history) that hold the same ids


def content_id(*parts: object) -> str:
    """A short stable digest of what a run holds: the id of a run whose file predates run ids
    (two hosts' ``0001_nightly.json`` share a name, never their samples)."""
    import hashlib

    text = json.dumps([str(p) for p in parts], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class FileFormatError(ValueError):
    """A file exists but cannot be used; the message names the file, the field and the fix."""


def _fsync_dir(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` so that readers see the old file or the new one, never a torn one.

    Temp file in the same directory (``os.replace`` is atomic only within a filesystem), fsync
    of the data, replace, then fsync of the directory so the rename itself survives a crash.
    An existing file keeps its mode and (where permitted) its owner: mkstemp's 0600 would
    otherwise make a shared baseline unreadable to the next CI user.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        old = path.stat()
    except FileNotFoundError:
        old = None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            if old is not None:
                os.fchmod(fh.fileno(), old.st_mode & 0o7777)
                try:
                    os.fchown(fh.fileno(), old.st_uid, old.st_gid)
                except PermissionError:
                    pass  # not root: the file becomes ours, its mode is kept
            else:
                umask = os.umask(0)
                os.umask(umask)
                os.fchmod(fh.fileno(), 0o666 & ~umask)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    # allow_nan=False: never write a file that our own reader would refuse
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n")


def _reject_constant(token: str) -> float:
    raise ValueError(f"{token} is not a number JSON allows")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose key appears twice is refused: JSON readers disagree on which one wins."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"key {key!r} appears twice in one object")
        obj[key] = value
    return obj


def _read_bounded(path: Path, fail: Any) -> bytes:
    """At most the cap + 1 bytes of a regular file. A FIFO is opened without blocking and a
    device (a link to /dev/zero) is refused before a byte is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise fail("no such file") from None
    except OSError as exc:
        raise fail(f"cannot be read ({exc.strerror or exc})") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise fail("is a directory, not a file")
        if not stat.S_ISREG(mode):
            raise fail("is not a regular file (a device, FIFO or socket): refused unread")
        chunks: list[bytes] = []
        total = 0
        while total <= MAX_FILE_BYTES:
            chunk = os.read(fd, min(2**20, MAX_FILE_BYTES + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise fail(f"cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if total > MAX_FILE_BYTES:
        raise fail(f"is larger than the {MAX_FILE_BYTES / 2**20:.0f} MiB limit")
    return b"".join(chunks)


def read_document(path: Path, kind: str, fix: str) -> dict[str, Any]:
    """Parse one JSON object from ``path``, bounded, as data only (never pickle or eval).

    Args:
        kind: what the file should be, for the message ("baseline", "saved run", ...).
        fix: what the user can do, appended to every error.

    Raises:
        FileFormatError: missing, unreadable, too large, not UTF-8, not JSON, too deep, not an
            object, or of a schema this scaleguard cannot read.
    """

    def fail(problem: str) -> FileFormatError:
        return FileFormatError(f"{kind} {path}: {problem}; {fix}")

    raw = _read_bounded(path, fail)
    if raw.count(b"{") + raw.count(b"[") > MAX_CONTAINERS or raw.count(b",") > MAX_SEPARATORS:
        raise fail(
            f"holds more than {MAX_CONTAINERS} objects and lists or {MAX_SEPARATORS} values: "
            "far more than any file scaleguard writes"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise fail(f"not UTF-8 text (byte {exc.start}): not a JSON file") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise fail(
            f"corrupt or truncated JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise fail("JSON nested too deeply") from None
    except ValueError as exc:  # NaN/Infinity, integers past Python's digit limit, duplicate keys
        raise fail(f"invalid JSON value: {exc}") from None
    if not isinstance(data, dict):
        raise fail(f"expected a JSON object, found {type(data).__name__}")
    version = data.get("schema_version", data.get("scaleguard_schema"))
    if version is not None and (isinstance(version, bool) or version not in READABLE_VERSIONS):
        newer = isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION
        hint = "it was written by a newer scaleguard: upgrade scaleguard" if newer else fix
        raise FileFormatError(
            f"{kind} {path}: schema_version {version!r}, but this scaleguard reads "
            f"{', '.join(map(str, READABLE_VERSIONS))}; {hint}"
        )
    return data


@dataclass(frozen=True)
class Fields:
    """Typed, bounded access to one JSON object; every problem names the file and the field."""

    data: dict[str, Any]
    where: str  # "baseline /x/y.json, cases.resnet50-ddp-ws2.2.11.0"
    fix: str = "restore the file from version control or move it aside"

    @classmethod
    def of(
        cls, value: Any, where: str, fix: str = "restore the file from version control or move it aside"
    ) -> Fields:
        if not isinstance(value, dict):
            raise FileFormatError(f"{where}: expected an object, found {type(value).__name__}; {fix}")
        return cls(value, where, fix)

    def fail(self, key: str, problem: str) -> FileFormatError:
        return FileFormatError(f"{self.where}: field {key!r} {problem}; {self.fix}")

    def known(self, allowed: set[str] | frozenset[str]) -> Fields:
        """Refuse keys this reader does not know: a misspelled ``"quarantined"`` would
        otherwise be dropped silently and a quarantined run count as evidence."""
        unknown = sorted(str(k) for k in self.data if k not in allowed)
        if unknown:
            shown = ", ".join(repr(k[:40]) for k in unknown[:5])
            raise FileFormatError(
                f"{self.where}: unknown field{'s' if len(unknown) > 1 else ''} {shown} "
                f"(known: {', '.join(sorted(allowed))}); {self.fix}"
            )
        return self

    def version(self) -> int:
        """A record's own schema version (absent in the oldest): one this scaleguard reads."""
        return int(self.integer("schema_version", 1, SCHEMA_VERSION, optional=True) or SCHEMA_VERSION)

    def byte_counts(self, key: str) -> tuple[int, ...]:
        """A non-empty list of byte counts (each rank's peak memory)."""
        value = self.items(key)
        if not value or not all(type(x) is int and 0 <= x <= 2**62 for x in value):
            raise self.fail(key, "must list each rank's peak memory in bytes")
        return tuple(int(x) for x in value)

    def ident(self, key: str, optional: bool = False) -> str | None:
        """A case id, group id or version: printable, no whitespace, at most 200 characters."""
        value = self.text(key, optional)
        if value is not None and not _ID.fullmatch(value):
            raise self.fail(
                key, f"is {value[:60]!r}: ids are 1-{MAX_ID_CHARS} printable characters without spaces"
            )
        return value

    def scalars(self, key: str, optional: bool = False) -> dict[str, str | int | float | bool | None]:
        """An object of plain values (strings, finite numbers, booleans, null): a case's config,
        versions or settings, which are compared, hashed and printed."""
        value = self._get(key, optional)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"must be an object, found {type(value).__name__}")
        if len(value) > 200:
            raise self.fail(key, f"has {len(value)} entries, more than 200")
        for name, item in value.items():
            if item is not None and not isinstance(item, (str, int, float, bool)):
                raise self.fail(key, f"entry {name!r} is {type(item).__name__}, not a plain value")
            if isinstance(item, float) and not math.isfinite(item):
                raise self.fail(key, f"entry {name!r} is {item}")
            if isinstance(item, int) and not isinstance(item, bool) and abs(item) > 2**62:
                raise self.fail(key, f"entry {name!r} is out of range")
            if isinstance(item, str) and len(item) > 4096:
                raise self.fail(key, f"entry {name!r} is longer than 4096 characters")
        return dict(value)

    def versions(self, key: str) -> dict[str, str | None]:
        """Versions as the ranks saw them: names to strings or null."""
        out: dict[str, str | None] = {}
        for name, item in self.scalars(key).items():
            if item is not None and not isinstance(item, str):
                raise self.fail(key, f"entry {name!r} must be a string or null")
            out[name] = item
        return out

    def floats(self, key: str, lo: float = -math.inf, hi: float = math.inf) -> dict[str, float]:
        """An object of finite numbers in [lo, hi] (timestamps, phase seconds)."""
        out = {}
        for name, item in self.raw_dict(key, optional=True).items():
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                raise self.fail(key, f"entry {name!r} is {type(item).__name__}, not a number")
            number = float(item)
            if not math.isfinite(number) or not lo <= number <= hi:
                raise self.fail(key, f"entry {name!r} is {number}, outside [{lo}, {hi}]")
            out[str(name)] = number
        return out

    def _get(self, key: str, optional: bool) -> Any:
        if key not in self.data or self.data[key] is None:
            if optional:
                return None
            raise self.fail(key, "is missing" if key not in self.data else "is null")
        return self.data[key]

    def obj(self, key: str) -> Fields:
        value = self._get(key, False)
        if not isinstance(value, dict):
            raise self.fail(key, f"must be an object, found {type(value).__name__}")
        if len(value) > MAX_ITEMS:
            raise self.fail(key, f"has {len(value)} entries, more than {MAX_ITEMS}")
        return Fields(value, f"{self.where}.{key}", self.fix)

    def raw_dict(self, key: str, optional: bool = False) -> dict[str, Any]:
        value = self._get(key, optional)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"must be an object, found {type(value).__name__}")
        return dict(value)

    def text(self, key: str, optional: bool = False) -> str | None:
        value = self._get(key, optional)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.fail(key, f"must be a string, found {type(value).__name__}")
        return value

    def string(self, key: str) -> str:
        value = self.text(key)
        assert value is not None
        return value

    def integer(self, key: str, lo: int = 0, hi: int = 2**62, optional: bool = False) -> int | None:
        value = self._get(key, optional)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an integer, found {type(value).__name__}")
        if not lo <= value <= hi:
            raise self.fail(key, f"is {value}, outside [{lo}, {hi}]")
        return value

    def number(self, key: str, lo: float = 0.0, hi: float = math.inf, optional: bool = False) -> float | None:
        value = self._get(key, optional)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"must be a number, found {type(value).__name__}")
        value = float(value)
        if not math.isfinite(value) or not lo <= value <= hi:
            raise self.fail(key, f"is {value}, outside [{lo}, {hi}]")
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, found {type(value).__name__}")
        return value

    def items(self, key: str, optional: bool = False) -> list[Any]:
        value = self._get(key, optional)
        if value is None:
            return []
        if not isinstance(value, (list, tuple)):  # tuple: a record's own to_dict(), not parsed
            raise self.fail(key, f"must be a list, found {type(value).__name__}")
        if len(value) > MAX_ITEMS:
            raise self.fail(key, f"has {len(value)} items, more than {MAX_ITEMS}")
        return list(value)

    def samples(self, key: str, min_len: int = 2) -> tuple[float, ...]:
        """Finite positive times, at least ``min_len`` and at most ``MAX_SAMPLES`` of them."""
        value = self._get(key, False)
        if not isinstance(value, (list, tuple)):
            raise self.fail(key, f"must be a list of seconds, found {type(value).__name__}")
        if not min_len <= len(value) <= MAX_SAMPLES:
            raise self.fail(key, f"has {len(value)} samples; needs {min_len} to {MAX_SAMPLES}")
        out = []
        for index, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                raise self.fail(key, f"item {index} is {type(item).__name__}, not a number")
            number = float(item)
            if not math.isfinite(number) or not 0 < number <= MAX_STEP_S:
                raise self.fail(
                    key,
                    f"item {index} is {number}: samples must be finite and positive "
                    f"seconds, at most {MAX_STEP_S:g}",
                )
            out.append(number)
        return tuple(out)


# --- records derived from their dataclass fields -------------------------------------------------
# A record type declares, per field, how its value is read (a ``Fields`` method with its bounds)
# and, where the stored form differs, how it is written. ``record_from_fields`` and
# ``record_to_dict`` walk the dataclass, so a field added to a record is read, checked and written
# with no second list to keep in step (and an unknown key in a file is refused, ``Fields.known``).

FieldReader = Callable[["Fields", str], Any]
_R = TypeVar("_R")


def stored(read: FieldReader | None, *, write: Callable[[Any], Any] | None = None, **field_kw: Any) -> Any:
    """A record field read by ``read(fields, key)`` (None: derived, passed by the record's own
    reader) and written by ``write(value)`` (None: as is). A field with a default may be absent
    or null in a file: it then keeps the default. ``field_kw``: ``default``/``default_factory``."""
    import dataclasses

    return dataclasses.field(metadata={"read": read, "write": write}, **field_kw)


def record_from_fields(
    cls: type[_R], f: Fields, extra_known: frozenset[str] = frozenset(), **given: Any
) -> _R:
    """An instance of the frozen record ``cls`` from ``f``: every field through its declared
    reader, unknown keys refused; ``given``: values the caller derived (a summary recomputed
    from the samples), ``extra_known``: keys written for readers of the file and ignored."""
    assert is_dataclass(cls)
    f.known(frozenset(x.name for x in fields(cls)) | extra_known)
    values = dict(given)
    for spec in fields(cls):
        if spec.name in given:
            continue
        read = spec.metadata.get("read")
        has_default = spec.default is not MISSING or spec.default_factory is not MISSING
        if read is None:
            if not has_default:
                raise TypeError(f"{cls.__name__}.{spec.name} is derived: pass it to record_from_fields")
            continue
        if has_default and f.data.get(spec.name) is None:
            continue
        values[spec.name] = read(f, spec.name)
    return cls(**values)


def record_to_dict(record: Any) -> dict[str, Any]:
    """The stored form of a record made with ``stored`` fields: each field by its writer, nested
    records by their ``to_dict``, tuples as lists, dicts copied."""
    import copy

    out: dict[str, Any] = {}
    for spec in fields(record):
        value = getattr(record, spec.name)
        write = spec.metadata.get("write")
        if write is not None:
            value = write(value)
        elif hasattr(value, "to_dict"):
            value = value.to_dict()
        elif isinstance(value, tuple):
            value = [v.to_dict() if hasattr(v, "to_dict") else copy.deepcopy(v) for v in value]
        else:
            value = copy.deepcopy(value)
        out[spec.name] = value
    return out


# the readers a record's fields declare (each checks type and bounds, names file and field)
def read_int(lo: int = 0, hi: int = 2**62) -> FieldReader:
    return lambda f, key: f.integer(key, lo, hi)


def read_number(lo: float = 0.0, hi: float = math.inf) -> FieldReader:
    return lambda f, key: f.number(key, lo, hi)


def read_samples(min_len: int = 2) -> FieldReader:
    return lambda f, key: f.samples(key, min_len)


def read_floats(lo: float = -math.inf, hi: float = math.inf) -> FieldReader:
    return lambda f, key: f.floats(key, lo, hi)


def read_text(f: Fields, key: str) -> str:
    return f.string(key)


def read_ident(f: Fields, key: str) -> str:
    return str(f.ident(key))


def read_flag(f: Fields, key: str) -> bool:
    return f.flag(key)


def read_scalars(f: Fields, key: str) -> dict[str, Any]:
    return f.scalars(key)


def read_versions(f: Fields, key: str) -> dict[str, str | None]:
    return f.versions(key)


MAX_DEPTH = 16  # a run's free-form facts (GPU clocks, a Slurm step's grant) nest 3 deep


def read_object(f: Fields, key: str) -> dict[str, Any]:
    """A free-form object of facts, nested at most ``MAX_DEPTH`` deep: every later reader,
    writer and printer of it recurses (600 levels ended in a RecursionError at the history)."""
    value = f.raw_dict(key)
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise f.fail(key, f"nests deeper than {MAX_DEPTH} levels")
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return value


def read_texts(f: Fields, key: str) -> tuple[str, ...]:
    """A list of strings (a run's notes)."""
    items = f.items(key)
    if not all(isinstance(x, str) for x in items):
        raise f.fail(key, "must be a list of strings")
    return tuple(items)


def read_byte_counts(f: Fields, key: str) -> tuple[int, ...]:
    """Each rank's peak memory in bytes; empty where a run's ranks did not say."""
    return f.byte_counts(key) if f.items(key) else ()


def read_version(f: Fields, key: str) -> int:
    return f.version()


def inert(text: object) -> str:
    """Text from files or the history for a terminal: control and format characters (newlines,
    escape sequences, bidi overrides) shown as ``\\x..`` escapes, so a stored value can neither
    draw a line of its own (a forged "change point") nor drive the terminal."""
    value = str(text)
    if value.isprintable():
        return value
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in value)
