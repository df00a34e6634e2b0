"""Where a history lives: a file (SQLite, the embedded default) or a PostgreSQL server.

Torch-free and driver-free: the option parser reads ``--perf-history`` through ``target_of``
before anything is measured, and a DSN shown anywhere (a line, an error, a page) shows as
``str(ServerDsn)``, its password masked. The DSN itself is handed to the driver alone.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

# CI secrets: the server's DSN from the environment when no --perf-history/--history is given
HISTORY_ENV = "SCALEGUARD_HISTORY"

_POSTGRES = re.compile(r"(?i)^postgres(ql)?://")
# other servers' URLs: refused by name (SQLite would make a file named after one, the password
# in a directory name, and say it appended there)
_OTHER_SERVER = re.compile(r"(?i)^(mysql|mariadb|sqlite|https?|clickhouse|redis|mongodb)(\+\w+)?:/")


def mask_secret(text: str) -> str:
    """A connection string as it may be shown: the password between ``user:`` and ``@``, and a
    ``password=`` parameter, masked."""
    text = re.sub(r"(//?[^:/@\s]*:)[^@\s]*@", r"\1***@", text)
    return re.sub(r"(?i)(password=)[^&\s]*", r"\1***", text)


@dataclass(frozen=True)
class ServerDsn:
    """A PostgreSQL connection string (``postgresql://user:password@host:port/db?sslmode=...``;
    TLS and other libpq parameters pass through untouched). ``str()`` masks the password."""

    dsn: str = field(repr=False)

    def __str__(self) -> str:
        return mask_secret(self.dsn)

    def __repr__(self) -> str:
        return f"ServerDsn({str(self)!r})"

    @property
    def password(self) -> str | None:
        """The password as written, to scrub from a driver's message (which may echo it)."""
        parsed = urllib.parse.urlsplit(self.dsn)
        found = urllib.parse.parse_qs(parsed.query).get("password")
        return parsed.password or (found[0] if found else None)

    def scrub(self, text: str) -> str:
        """``text`` (a driver's error) without the password, however it was quoted."""
        text = mask_secret(text)
        secret = self.password
        if secret:
            for form in {secret, urllib.parse.unquote(secret), urllib.parse.quote(secret)}:
                text = text.replace(form, "***")
        return text


HistoryTarget = Path | ServerDsn


class TargetError(ValueError):
    """A --history value that names no usable history; the message masks any password."""


def target_of(text: str, option: str = "--perf-history") -> HistoryTarget:
    """A file path, or a PostgreSQL DSN (checked for form here; reached when opened)."""
    if _POSTGRES.match(text):
        parsed = urllib.parse.urlsplit(text)
        try:
            parsed.port  # noqa: B018 - raises on a port that is not a number
        except ValueError:
            raise TargetError(f"{option} {mask_secret(text)}: its port is not a number") from None
        if not parsed.hostname and "host=" not in parsed.query:
            raise TargetError(f"{option} {mask_secret(text)}: names no host (postgresql://user@host/db)")
        return ServerDsn(text)
    if _OTHER_SERVER.match(text):
        raise TargetError(
            f"{option} {mask_secret(text)}: a history lives in a file (SQLite) or on PostgreSQL "
            "(postgresql://...), not on this server"
        )
    return Path(text)


def shown(target: HistoryTarget) -> str:
    """How a history is named in any output."""
    return str(target)
