#!/usr/bin/env python3
"""A throwaway PostgreSQL for the history tests and for trying a server history by hand.

    python tools/local_postgres.py start DIR   # prints the writer's and the reader's DSN
    python tools/local_postgres.py stop DIR    # the server stops; DIR stays (start it again)
    python tools/local_postgres.py start DIR   # same data, same port

Debian's PostgreSQL 15 (``apt-get install postgresql``): ``initdb`` and ``pg_ctl`` as the
``postgres`` user (PostgreSQL refuses to run as root) under DIR, listening on 127.0.0.1 at a free
port with password authentication (scram), and on a socket in DIR. Two roles on database ``sg``:
``sg`` (owner: writes) and ``sg_reader`` (may read the history's tables, nothing else). Every
wait has a deadline; ``stop`` is ``pg_ctl stop -m fast``.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

PASSWORD = "sg-secret-7c1f"  # a throwaway server's; the tests check that it is never printed
READER_PASSWORD = "sg-reader-secret-2b9d"
DEADLINE_S = 60.0


def _bin(name: str) -> str:
    for root in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (root / name).exists():
            return str(root / name)
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found: apt-get install -y postgresql")
    return found


def available() -> bool:
    try:
        _bin("initdb"), _bin("pg_ctl")
        pwd.getpwnam("postgres")
        return True
    except (SystemExit, KeyError):
        return False


def _as_postgres(args: list[str], timeout: float = DEADLINE_S) -> subprocess.CompletedProcess[str]:
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    return subprocess.run(prefix + args, capture_output=True, text=True, timeout=timeout, check=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _state(root: Path) -> dict[str, object]:
    return json.loads((root / "scaleguard-server.json").read_text())


def dsn(root: Path, reader: bool = False) -> str:
    port = _state(root)["port"]
    user, password = ("sg_reader", READER_PASSWORD) if reader else ("sg", PASSWORD)
    return f"postgresql://{user}:{password}@127.0.0.1:{port}/sg"


def start(root: Path) -> str:
    """Start (creating it on first use) the server under ``root``; the writer's DSN."""
    root.mkdir(parents=True, exist_ok=True)
    data = root / "data"
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
    fresh = not (data / "PG_VERSION").exists()
    if fresh:
        pwfile = root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if os.geteuid() == 0:
            os.chown(pwfile, pwd.getpwnam("postgres").pw_uid, -1)
        made = _as_postgres(
            [_bin("initdb"), "-D", str(data), "-U", "postgres", "--auth=scram-sha-256",
             f"--pwfile={pwfile}", "-E", "UTF8", "--no-instructions"]
        )  # fmt: skip
        pwfile.unlink()
        if made.returncode != 0:
            raise SystemExit(f"initdb failed: {made.stderr.strip()}")
        (root / "scaleguard-server.json").write_text(json.dumps({"port": _free_port()}))
    port = _state(root)["port"]
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=60"
    started = _as_postgres(
        [_bin("pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-o", options,
         "-w", "-t", str(int(DEADLINE_S)), "start"]
    )  # fmt: skip
    if started.returncode != 0:
        raise SystemExit(f"pg_ctl start failed: {started.stderr.strip() or started.stdout.strip()}")
    if fresh:
        _setup(root, int(port))  # type: ignore[arg-type]
    return dsn(root)


def _setup(root: Path, port: int) -> None:
    sql = (
        f"CREATE ROLE sg LOGIN PASSWORD '{PASSWORD}'; "
        f"CREATE ROLE sg_reader LOGIN PASSWORD '{READER_PASSWORD}'; "
        "CREATE DATABASE sg OWNER sg;"
    )
    env = {**os.environ, "PGPASSWORD": PASSWORD}
    for statement in sql.split("; "):
        done = subprocess.run(
            [_bin("psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", "postgres",
             "-v", "ON_ERROR_STOP=1", "-c", statement.rstrip(";")],
            capture_output=True, text=True, env=env, timeout=DEADLINE_S, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"setting up the server failed: {done.stderr.strip()}")
    # the reader may read every table the owner makes, now and later
    done = subprocess.run(
        [_bin("psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "sg", "-d", "sg", "-v", "ON_ERROR_STOP=1",
         "-c", "ALTER DEFAULT PRIVILEGES FOR ROLE sg IN SCHEMA public GRANT SELECT ON TABLES TO sg_reader"],
        capture_output=True, text=True, env={**os.environ, "PGPASSWORD": PASSWORD}, timeout=DEADLINE_S,
        check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"setting up the server failed: {done.stderr.strip()}")


def stop(root: Path) -> None:
    data = root / "data"
    if not (data / "postmaster.pid").exists():
        return
    _as_postgres([_bin("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", str(int(DEADLINE_S)), "stop"])
    end = time.monotonic() + DEADLINE_S
    while (data / "postmaster.pid").exists() and time.monotonic() < end:
        time.sleep(0.1)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(argv[1]).absolute()
    if argv[0] == "start":
        print(start(root))
        print(dsn(root, reader=True))
    else:
        stop(root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
