"""Opening the database: where it is, how connections are set up, migrations,
and transactions that retry while another process holds the lock.

Default location: an SQLite file at `$XDG_DATA_HOME/mpipe/mpipe.db`, falling
back to `~/.local/share/mpipe/mpipe.db`.  `MPIPE_DB_URL` (or the CLI's `--db`)
names any SQLAlchemy URL instead, e.g. `postgresql+psycopg://host/mpipe` for a
team server; a value without `://` is taken as an SQLite file path.

SQLite connections get WAL mode, `synchronous=NORMAL`, `busy_timeout` and
`foreign_keys=ON`, and every writing transaction starts with `BEGIN IMMEDIATE`:
it takes the write lock before reading anything, so the busy timeout applies
and two writers can never both read a stale snapshot and then collide.
"""
from __future__ import annotations

import copy
import os
import random
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    IntegrityError,
    NoSuchModuleError,
    OperationalError,
)
from sqlalchemy.orm import Session, sessionmaker

from storage.errors import DatabaseLockedError, PermissionDeniedError, SchemaError
from storage.migrations import HEAD as MIGRATIONS_HEAD

T = TypeVar("T")

DB_URL_ENV = "MPIPE_DB_URL"
BUSY_TIMEOUT_ENV = "MPIPE_DB_BUSY_TIMEOUT_MS"
DEFAULT_BUSY_TIMEOUT_MS = 30_000
# After the driver's own wait (busy_timeout) runs out, the whole transaction is
# retried this many times with jittered exponential backoff before giving up.
LOCK_RETRIES = 4
MIGRATIONS_DIR = Path(__file__).with_name("migrations")
# pg_advisory_xact_lock key that serialises concurrent migrations ("mpipe").
_PG_MIGRATION_LOCK = 0x6D70697065
# PostgreSQL errors worth retrying: serialization failure, deadlock, lock not available.
_PG_RETRY_CODES = {"40001", "40P01", "55P03"}
_PG_INSUFFICIENT_PRIVILEGE = "42501"


def default_db_path() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "mpipe" / "mpipe.db"


def resolve_db_url(url: str | None = None) -> str:
    """The URL to open: the argument, else $MPIPE_DB_URL, else the default file."""
    url = url or os.environ.get(DB_URL_ENV) or ""
    if not url:
        return f"sqlite:///{default_db_path()}"
    if "://" not in url:
        return f"sqlite:///{os.path.abspath(url)}"
    return url


def _busy_timeout_ms(value: int | None) -> int:
    if value is not None:
        return value
    raw = os.environ.get(BUSY_TIMEOUT_ENV)
    if raw:
        try:
            return max(0, int(raw))
        except ValueError:
            raise SchemaError(f"{BUSY_TIMEOUT_ENV} must be a number of milliseconds, not {raw!r}") from None
    return DEFAULT_BUSY_TIMEOUT_MS


def _make_engine(url: str, busy_timeout_ms: int) -> Engine:
    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018 - a non-numeric port raises only when read
    except (ArgumentError, ValueError):
        raise SchemaError(f"not a database URL: {url!r}") from None
    if parsed.get_backend_name() != "sqlite":
        try:
            return create_engine(parsed, pool_pre_ping=True)
        except NoSuchModuleError:
            raise SchemaError(f"unknown database kind in {url!r}") from None
        except ImportError as error:
            raise SchemaError(f"the driver for {parsed.drivername} is not installed ({error.name}); "
                              f"install mpipe[storage]") from None

    database = parsed.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        folder = Path(database).expanduser().parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise SchemaError(f"cannot create {folder} for the database: {error.strerror}") from None
    engine = create_engine(parsed, connect_args={"timeout": busy_timeout_ms / 1000})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        # Let SQLAlchemy's "begin" event (below) issue BEGIN, not the driver.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection) -> None:
        immediate = connection.get_execution_options().get("mpipe_write", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def is_lock_error(error: BaseException) -> bool:
    """A failure that goes away if the same transaction is tried again later."""
    if not isinstance(error, DBAPIError):
        return False
    code = getattr(error.orig, "sqlstate", None)
    if code in _PG_RETRY_CODES:
        return True
    message = str(error.orig).lower()
    return isinstance(error, OperationalError) and ("locked" in message or "busy" in message)


def permission_refusal(error: BaseException) -> str | None:
    """The database's own reason when it refused an operation to this connection's user
    (PostgreSQL's insufficient privilege, a read-only SQLite file); else None."""
    if not isinstance(error, DBAPIError):
        return None
    message = str(error.orig).strip().splitlines()[0] if str(error.orig).strip() else ""
    if getattr(error.orig, "sqlstate", None) == _PG_INSUFFICIENT_PRIVILEGE or "readonly database" in message:
        return message
    return None


@dataclass
class Database:
    """One process's handle on the database: an engine and its transactions."""

    url: str
    engine: Engine
    lock_retries: int = LOCK_RETRIES
    # Who acts for the writes made through this handle (a `storage.access.Actor`);
    # None: the local user, with every right.  See `acting_as`.
    actor: Any = None

    def __post_init__(self) -> None:
        self._write_engine = self.engine.execution_options(mpipe_write=True)
        self._read_sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_sessions = sessionmaker(self._write_engine, expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @property
    def display_url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    @contextmanager
    def session(self, write: bool = False) -> Iterator[Session]:
        """A session in one transaction, committed on success (for callers that
        want the ORM directly; the library functions use `read`/`write`)."""
        factory = self._write_sessions if write else self._read_sessions
        with factory() as session, session.begin():
            yield session

    def read(self, work: Callable[[Session], T]) -> T:
        return self._transaction(work, write=False)

    def write(self, work: Callable[[Session], T]) -> T:
        """Run `work(session)` in one writing transaction, committed if it
        returns and rolled back if it raises.  A locked database is retried
        with backoff; after the last try it raises DatabaseLockedError."""
        return self._transaction(work, write=True)

    def _transaction(self, work: Callable[[Session], T], write: bool) -> T:
        delay = 0.05
        integrity_retries = 1
        attempt = 0
        while True:
            try:
                with self.session(write=write) as session:
                    return work(session)
            except IntegrityError:
                # A concurrent writer inserted the same key between our check and
                # our insert (PostgreSQL, READ COMMITTED): run `work` once more so
                # its own check reports the conflict clearly.
                if integrity_retries == 0:
                    raise
                integrity_retries -= 1
            except DBAPIError as error:
                refusal = permission_refusal(error)
                if refusal is not None:
                    # The database's own permissions: the boundary of a CLI on a shared database.
                    raise PermissionDeniedError(f"database {self.display_url} refused: {refusal}") from None
                if not is_lock_error(error):
                    raise
                attempt += 1
                if attempt > self.lock_retries:
                    raise DatabaseLockedError(
                        f"database {self.display_url} is locked by another process "
                        f"(gave up after {attempt} tries); try again when it is free"
                    ) from None
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 2.0)

    def acting_as(self, actor) -> Database:
        """This handle, sharing its engine, with `actor` acting for every write made
        through it: the app gives each request its signed-in user this way, so no
        write path of its pages can forget who acts."""
        other = copy.copy(self)
        other.actor = actor
        return other

    def close(self) -> None:
        self.engine.dispose()


_open_lock = threading.Lock()


def open_database(url: str | None = None, *, upgrade: bool = True,
                  busy_timeout_ms: int | None = None) -> Database:
    """Open (creating it if needed) the database and bring its schema up to date.

    Raises SchemaError for a database written by a newer mpipe."""
    resolved = resolve_db_url(url)
    db = Database(resolved, _make_engine(resolved, _busy_timeout_ms(busy_timeout_ms)))
    try:
        _prepare_schema(db, upgrade)
    except DBAPIError as error:  # not a database, unreachable, refused
        db.close()
        if is_lock_error(error):
            raise DatabaseLockedError(f"database {db.display_url} is locked by another process "
                                      f"(gave up after {db.lock_retries + 1} tries); "
                                      f"try again when it is free") from None
        reason = "; ".join(line.strip() for line in str(error.orig).splitlines() if line.strip())
        raise SchemaError(f"cannot open database {db.display_url}: {reason}") from None
    except BaseException:
        db.close()
        raise
    return db


def _prepare_schema(db: Database, upgrade: bool) -> None:
    """Migrate (or only check) the schema, retrying a locked database with backoff.

    SQLite answers some lock conflicts at once, without its busy handler: a
    process that opens the file while another turns it to WAL or recovers its
    index gets "database is locked" immediately, so several processes opening a
    new database together need the same retry the write transactions have."""
    delay = 0.05
    for attempt in range(db.lock_retries + 1):
        try:
            if upgrade:
                with _open_lock:
                    upgrade_schema(db)
            else:
                check_schema(db)
            return
        except DBAPIError as error:
            if not is_lock_error(error) or attempt == db.lock_retries:
                raise
            db.engine.dispose()  # a connection that saw the lock may hold a stale snapshot
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 2.0)


# --- migrations ---------------------------------------------------------------------------

def _alembic_config():
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


def current_revision(db: Database) -> str | None:
    with db.engine.connect() as connection:
        if not inspect(connection).has_table("alembic_version"):
            return None
        return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()


def check_schema(db: Database) -> str | None:
    """The database's revision; SchemaError if this mpipe does not know it."""
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    revision = current_revision(db)
    if revision is None:
        return None
    try:
        ScriptDirectory.from_config(_alembic_config()).get_revision(revision)
    except CommandError:
        raise SchemaError(
            f"database {db.display_url} has schema revision {revision}, newer than this "
            f"mpipe knows (latest {head_revision()}); upgrade mpipe to use it"
        ) from None
    return revision


def upgrade_schema(db: Database) -> str:
    """Apply every pending migration; returns the revision now in place."""
    if current_revision(db) == MIGRATIONS_HEAD:  # the usual case: nothing to do, no Alembic import
        return MIGRATIONS_HEAD
    from alembic import command

    head = head_revision()
    if check_schema(db) == head:
        return head
    config = _alembic_config()
    # One transaction holding the write lock (SQLite: BEGIN IMMEDIATE; PostgreSQL:
    # an advisory lock), so processes opening a new database at once take turns
    # and the later ones find it already migrated.
    with db._write_engine.begin() as connection:
        if db.dialect == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
    return check_schema(db) or head
