"""A throw-away PostgreSQL server for tests, demos and benchmarks.

``TempPostgres`` runs ``initdb`` in a fresh temporary directory and ``pg_ctl`` to start a
server on 127.0.0.1 on a free port, with ``max_prepared_transactions`` set (two-phase commit
needs it) and password authentication over TCP. It never touches a system cluster. When
this process runs as root (PostgreSQL refuses to), the server runs as the ``postgres`` user
created by the Debian package.

The server binaries come from Debian's ``postgresql`` package (``scripts/setup.sh``
installs it); :func:`find_bin_dir` fails with that advice when they are missing.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from exactly.errors import ConfigError
from exactly.testing.ports import free_port

SETUP_HINT = ("run scripts/setup.sh postgres (it installs Debian's postgresql package), or set "
              "EXACTLY_PG_BIN to a directory holding initdb, pg_ctl and postgres")


def find_bin_dir() -> Path:
    """Directory of ``initdb``/``pg_ctl``: ``EXACTLY_PG_BIN``, PATH, or Debian's location."""
    env = os.environ.get("EXACTLY_PG_BIN")
    candidates = [env] if env else []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                         key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit()
                         else 0, reverse=True)
    for directory in candidates:
        if directory and (Path(directory) / "initdb").exists() and \
                (Path(directory) / "pg_ctl").exists():
            return Path(directory)
    raise ConfigError(f"PostgreSQL server binaries (initdb, pg_ctl) not found: {SETUP_HINT}")



class TempPostgres:
    """A PostgreSQL server in a temporary directory, on 127.0.0.1:``port``.

    ``dsn`` carries a password (password authentication is on for TCP), so code under test
    meets a real secret that must never show in logs or errors.
    """

    def __init__(self, *, max_prepared_transactions: int = 20, max_connections: int = 60,
                 user: str = "exactly", database: str = "exactly",
                 extra_settings: dict[str, str] | None = None) -> None:
        self.bin = find_bin_dir()
        self.user = user
        self.database = database
        self.password = secrets.token_hex(12)
        self.port = free_port()
        self.settings = {"max_prepared_transactions": str(max_prepared_transactions),
                         "max_connections": str(max_connections),
                         "fsync": "on", "listen_addresses": "127.0.0.1",
                         **(extra_settings or {})}
        self.root = Path(tempfile.mkdtemp(prefix="exactly-pg-"))
        self.data = self.root / "data"
        self.logfile = self.root / "server.log"
        self._run_as = self._server_user()

    # -- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> TempPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def start(self) -> None:
        """initdb on first use, then start the server and wait until it accepts clients."""
        fresh = not (self.data / "PG_VERSION").exists()
        if fresh:
            self._initdb()
        options = " ".join(f"-c {k}={v}" for k, v in self.settings.items())
        options += f" -p {self.port} -k {self.root}"
        self._pg(["pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-w", "-t", "60",
                  "-o", options, "start"])
        if fresh:
            import psycopg

            admin = self.dsn.rsplit("/", 1)[0] + "/postgres"
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{self.database}"')

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m MODE``; ``immediate`` is a crash (recovery runs at next start)."""
        self._pg(["pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", mode, "stop"],
                 check=False)

    def restart_after_crash(self) -> None:
        """Stop with ``-m immediate`` (no shutdown checkpoint), then start again."""
        self.stop("immediate")
        self.start()

    def destroy(self) -> None:
        """Stop the server and remove its directory."""
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def pid(self) -> int | None:
        """The postmaster's pid (None while the server is down)."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    # -- connection ------------------------------------------------------------------
    @property
    def dsn(self) -> str:
        return (f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/"
                f"{self.database}")

    def connect(self, autocommit: bool = True):
        import psycopg

        return psycopg.connect(self.dsn, autocommit=autocommit)

    def rollback_prepared(self) -> int:
        """Roll back every prepared transaction left on the server; returns how many.

        For a server shared by many tests: a test that leaves prepared transactions on
        purpose (a fenced instance's pre-commits, a crash it does not recover from) must not
        change what later tests count.
        """
        from psycopg import sql

        with self.connect() as c:
            gids = [r[0] for r in c.execute("SELECT gid FROM pg_prepared_xacts").fetchall()]
            for gid in gids:
                c.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        return len(gids)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- internals -------------------------------------------------------------------
    @staticmethod
    def _server_user() -> str | None:
        if os.geteuid() != 0:
            return None
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise ConfigError("running as root, PostgreSQL needs an unprivileged user to run "
                              f"the server and there is no 'postgres' user: {SETUP_HINT}"
                              ) from None
        return "postgres"

    def _initdb(self) -> None:
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self._run_as:
            entry = pwd.getpwnam(self._run_as)
            for path in (self.root, pwfile):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._pg(["initdb", "-D", str(self.data), "-U", self.user, "--pwfile", str(pwfile),
                  "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8",
                  "--locale=C", "--no-sync"])
        pwfile.unlink()

    def _pg(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        argv = [str(self.bin / argv[0]), *argv[1:]]
        if self._run_as:
            argv = ["runuser", "-u", self._run_as, "--", *argv]
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=self.root,
                              env={**os.environ, "LC_ALL": "C"})
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr}"
                               f"\n{proc.stdout}\n--- server log ---\n{self.log_tail()}")
        return proc


def wait_until_accepting(pg: TempPostgres, timeout: float = 60) -> None:
    """Wait until the server accepts connections again (after a restart)."""
    import psycopg

    from exactly.retry import retry_call

    def connect() -> None:
        with pg.connect():
            pass

    retry_call(connect, what="connect to the restarted server", seconds=timeout,
               transient=lambda exc: isinstance(exc, psycopg.OperationalError))
