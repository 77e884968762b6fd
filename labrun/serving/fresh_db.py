"""A new Prefect home's SQLite database, loaded from a schema dump instead of migrated.

Prefect creates its database by running every one of its migrations (116 for SQLite in
3.9), which takes about 11 s of CPU: most of a first run's start-up. Loading the schema
those migrations end with takes 0.04 s (Rails' `db:schema:load` against `db:migrate`, for the
same reason). The dump, `prefect-sqlite-schema.sql` beside this file, is made from the
installed Prefect's own migrations by

    python -m labrun.serving.fresh_db

and names the migrations it holds. It is used only for a database file that does not exist
yet, and only when the installed Prefect has the dump's last migration: a newer Prefect then
migrates from there, as from any older database; an older one migrates from scratch.
tests/test_fresh_db.py checks that a database loaded from the dump and then migrated by the
installed Prefect is the one that Prefect's migrations alone make.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sqlite3
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

DUMP = Path(__file__).with_name("prefect-sqlite-schema.sql")


def migrations_dir() -> Path:
    """The installed Prefect's SQLite migrations, found without importing Prefect."""
    spec = importlib.util.find_spec("prefect")
    assert spec is not None and spec.submodule_search_locations, "prefect is not installed"
    return Path(list(spec.submodule_search_locations)[0]) / "server/database/_migrations/versions/sqlite"


@lru_cache(maxsize=1)
def installed_revisions() -> frozenset[str]:
    found = set()
    for script in migrations_dir().glob("*.py"):
        match = re.search(r"^revision\s*(?::\s*str\s*)?=\s*['\"]([0-9a-f]+)['\"]", script.read_text(), re.M)
        if match:
            found.add(match[1])
    return frozenset(found)


def dump_revisions(dump: Path | None = None) -> tuple[str, set[str]]:
    """The dump's last migration, and every migration it holds (its header says)."""
    head, held = "", set()
    with open(dump or DUMP) as f:
        for line in f:
            if not line.startswith("--"):
                break
            if line.startswith("-- head: "):
                head = line.split(":", 1)[1].strip()
            elif line.startswith("-- migrations: "):
                held = set(line.split(":", 1)[1].split())
    return head, held


def sqlite_path(connection_url: str) -> Path | None:
    """The file of a plain SQLite connection URL; None for anything else (PostgreSQL, a
    URL with options, an in-memory database)."""
    from sqlalchemy.engine import make_url

    url = make_url(connection_url)
    if url.get_backend_name() != "sqlite" or url.query or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database)


def default_path(env: dict[str, str]) -> Path | None:
    """The database that a Prefect server started with `env` uses, when nothing but
    PREFECT_HOME places it (the usual case); None when any setting names a database, and
    the server's own migrations then do what they always do."""
    if any(k.startswith(("PREFECT_SERVER_DATABASE_", "PREFECT_API_DATABASE_")) for k in env):
        return None
    home = Path(env.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
    profiles = Path(env.get("PREFECT_PROFILES_PATH") or home / "profiles.toml").expanduser()
    try:
        if "DATABASE" in profiles.read_text():
            return None
    except OSError:
        pass
    return home / "prefect.db"


def create(path: Path) -> bool:
    """Make the database at `path` from the dump, unless it exists or the installed Prefect
    lacks the dump's last migration. True when it did."""
    if path.exists() or dump_revisions()[0] not in installed_revisions():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, part = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        db = sqlite3.connect(part)
        try:
            db.executescript(DUMP.read_text())
        finally:
            db.close()
        os.link(part, path)  # never over a database that another process made meanwhile
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(part)


def create_default(env: dict[str, str]) -> bool:
    """`create` the database that a Prefect server started with `env` uses, when nothing but
    PREFECT_HOME places it (`default_path`)."""
    path = default_path(env)
    return path is not None and create(path)


def is_current(path: Path) -> bool:
    """Whether the database at `path` has every migration the installed Prefect has: it is at
    the dump's last migration, and the dump holds them all. Prefect's own migration pass
    would find nothing to do, in a second."""
    head, held = dump_revisions()
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            (revision,), = db.execute("SELECT version_num FROM alembic_version")
        finally:
            db.close()
    except (sqlite3.Error, ValueError):
        return False
    return revision == head and installed_revisions() <= held


def write_dump(dump: Path = DUMP) -> None:
    """Run the installed Prefect's migrations on a new database and dump its schema."""
    import asyncio

    with tempfile.TemporaryDirectory() as home:
        os.environ.update({"PREFECT_HOME": home, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
        os.environ.pop("PREFECT_API_URL", None)
        import prefect
        from prefect.server.database import provide_database_interface

        asyncio.run(provide_database_interface().create_db())
        db = sqlite3.connect(Path(home) / "prefect.db")
        try:
            statements = list(db.iterdump())
            (head,), = db.execute("SELECT version_num FROM alembic_version")
        finally:
            db.close()
    dump.write_text(
        f"-- Prefect {prefect.__version__}'s SQLite schema after its migrations, written by "
        "`python -m labrun.serving.fresh_db`.\n"
        f"-- head: {head}\n"
        f"-- migrations: {' '.join(sorted(installed_revisions()))}\n"
        + "\n".join(statements) + "\n")


if __name__ == "__main__":
    write_dump(Path(sys.argv[1]) if len(sys.argv) > 1 else DUMP)
    print(f"wrote {sys.argv[1] if len(sys.argv) > 1 else DUMP}")
