"""A throwaway PostgreSQL server for tests and benchmarks (imported by name; not a test module).

``PostgresServer.start()`` runs ``initdb`` into a new temporary folder, starts the server with
``pg_ctl`` on a free port, listening on a Unix socket in that folder only (no TCP), with
durability off (``fsync=off``: nothing here must survive a crash), and creates a database.
``stop()`` stops the server and removes the folder.

PostgreSQL refuses to run as root. As root, the server runs as the ``postgres`` user (which
Debian's ``postgresql`` package creates), else as ``nobody``, through ``runuser``; the folder is
handed to that user, and the tests connect over the socket as the database user ``postgres``
(trust authentication: the socket is in a folder only that user and root can enter).

The binaries are found on ``PATH`` or in ``/usr/lib/postgresql/<version>/bin`` (where Debian
installs them without putting them on ``PATH``); ``find_binaries()`` returns None, with the
reason in ``MISSING_REASON``, when there are none.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

DATABASE = "dataflow_test"
MISSING_REASON = (
    "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or in /usr/lib/postgresql/*/bin: "
    "install Debian's postgresql package (apt-get install postgresql)"
)


def find_binaries() -> Path | None:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``, or None."""
    found = shutil.which("initdb")
    candidates = [str(Path(found).resolve().parent)] if found else []
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for folder in candidates:
        if all(os.access(os.path.join(folder, name), os.X_OK) for name in ("initdb", "pg_ctl", "postgres")):
            return Path(folder)
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_user() -> str | None:
    """The user to run the server as when this process is root (None: run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError("running as root, and neither a 'postgres' nor a 'nobody' user exists to run PostgreSQL as")


class PostgresServer:
    """One server in its own temporary folder; ``conninfo`` reaches its database."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.user = _server_user()
        self.root = Path(tempfile.mkdtemp(prefix="dataflow-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = _free_port()
        self.started = False

    @property
    def conninfo(self) -> str:
        """A libpq connection string for the test database, over the Unix socket."""
        return f"host={self.root} port={self.port} user=postgres dbname={DATABASE}"

    def _run(self, *args: str, timeout: float = 60) -> None:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            msg = f"{' '.join(command)} failed ({result.returncode}): {result.stderr or result.stdout}\n{log}"
            raise RuntimeError(msg)

    def start(self) -> PostgresServer:
        """initdb, start, create the database; the folder is removed again if any step fails."""
        try:
            if self.user is not None:
                entry = pwd.getpwnam(self.user)
                os.chown(self.root, entry.pw_uid, entry.pw_gid)
            os.chmod(self.root, 0o700)
            self._run("initdb", "-D", str(self.data), "--auth=trust", "-U", "postgres", "--no-sync",
                      "-E", "UTF8", "--locale=C")
            options = (
                f"-k {self.root} -p {self.port} -c listen_addresses='' -c fsync=off "
                "-c full_page_writes=off -c synchronous_commit=off"
            )
            self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", options, "start")
            self.started = True
            self._create_database()
        except BaseException:
            self.stop()
            raise
        return self

    def _create_database(self) -> None:
        import psycopg

        with psycopg.connect(f"host={self.root} port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its folder."""
        try:
            if self.started:
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")
                self.started = False
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
