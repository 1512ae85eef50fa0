"""A private PostgreSQL server for one test: started, stopped and started again at will.

The shared server at ``CONVMATRIX_TEST_PG_URL`` serves every other test (and other people's):
a test that stops its database mid-run gets its own, from the machine's PostgreSQL binaries
(``initdb`` into a temporary directory, ``pg_ctl`` on a free port with its socket in that
directory, trust authentication, 127.0.0.1 only). Run as root, the binaries run as the
``postgres`` user (PostgreSQL refuses root). The binaries are the ``postgresql-server``
component (tests/components.py): missing, the test skips locally and fails under CI.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PrivatePostgres", "postgres_bin"]


def postgres_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl`` (the newest installed), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and shutil.which("pg_ctl") else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PrivatePostgres:
    """``with PrivatePostgres() as pg:`` then ``pg.url``, ``pg.stop()``, ``pg.start()``.

    Its directory is a fresh one under the temporary directory (pytest's ``tmp_path`` is not
    reachable by the ``postgres`` user), removed on exit."""

    port: int = 0

    def __post_init__(self) -> None:
        bin_dir = postgres_bin()
        assert bin_dir is not None, "no PostgreSQL binaries (the postgresql-server component)"
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="convmatrix-pg-"))
        self.data = self.root / "pgdata"
        self.port = self.port or _free_port()
        self.as_root = os.geteuid() == 0

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def command(self, *args: str) -> list[str]:
        """A PostgreSQL program's command line, as the ``postgres`` user when we are root."""
        argv = [str(self.bin / args[0]), *args[1:]]
        return ["runuser", "-u", "postgres", "--", *argv] if self.as_root else argv

    def _run(self, *args: str) -> None:
        done = subprocess.run(self.command(*args), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{args[0]} failed: {done.stdout}{done.stderr}"

    def stop_command(self, mode: str = "immediate") -> list[str]:
        """``pg_ctl stop``: ``immediate`` is a crash (the next start recovers)."""
        return self.command("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def init(self) -> None:
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=20 -c shared_buffers=16MB"
        )
        log = str(self.root / "server.log")
        self._run("pg_ctl", "-D", str(self.data), "-l", log, "-o", options, "-w", "start")

    def stop(self, mode: str = "immediate") -> None:
        subprocess.run(self.stop_command(mode), capture_output=True, timeout=120)

    def __enter__(self) -> PrivatePostgres:
        self.init()
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
