"""A new Prefect home's database comes from labrun's schema dump (labrun/serving/fresh_db.py):
it must be the database that the installed Prefect's own migrations make."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from labrun.serving import fresh_db
from labrun.serving.processes import free_port, server_env, start_api, stop, wait_healthy

MIGRATE = ("import asyncio; from prefect.server.database import provide_database_interface; "
           "asyncio.run(provide_database_interface().create_db())")


def prefect_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    return {**env, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def normalised(statements: list[str]) -> list[list[str]]:
    """The statements, each as its sorted lines, in sorted order: Prefect's migrations
    rebuild tables with their constraints in an order that changes from run to run, and
    SQLite lists indexes in the order they were made."""
    return sorted(sorted(line.strip().rstrip(",").rstrip() for line in s.splitlines()) for s in statements)


def schema(db: Path) -> list[list[str]]:
    conn = sqlite3.connect(db)
    try:
        return normalised(list(conn.iterdump()))
    finally:
        conn.close()


def dumped(dump: Path) -> list[list[str]]:
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(dump.read_text())
        return normalised(list(conn.iterdump()))
    finally:
        conn.close()


def test_the_dump_then_prefects_migrations_make_what_its_migrations_alone_make(tmp_path):
    # What Prefect's migrations make from nothing, dumped as labrun dumps it.
    made = tmp_path / "made.sql"
    subprocess.run([sys.executable, "-m", "labrun.serving.fresh_db", str(made)], env=prefect_env(tmp_path / "a"),
                   check=True, capture_output=True, timeout=300)
    # A home whose database comes from the dump, then migrated by Prefect as at every start.
    home = tmp_path / "b"
    assert fresh_db.create(home / "prefect.db")
    subprocess.run([sys.executable, "-c", MIGRATE], env=prefect_env(home), check=True, capture_output=True,
                   timeout=300)

    assert schema(home / "prefect.db") == dumped(made)
    assert fresh_db.is_current(home / "prefect.db") == (fresh_db.dump_revisions() == fresh_db.dump_revisions(made))


def test_the_dump_makes_only_a_database_that_does_not_exist_for_a_prefect_that_has_its_migrations(
        tmp_path, monkeypatch):
    existing = tmp_path / "existing.db"
    existing.write_bytes(b"")
    assert not fresh_db.create(existing)
    assert existing.read_bytes() == b""

    made = tmp_path / "home" / "prefect.db"
    assert fresh_db.create(made) and not fresh_db.create(made)
    assert {"flow_run", "task_run", "alembic_version"} <= {
        name for (name,) in sqlite3.connect(made).execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert [p.name for p in made.parent.iterdir()] == ["prefect.db"]  # no part-written file left
    assert not fresh_db.is_current(existing) and not fresh_db.is_current(tmp_path / "none.db")

    # A dump from a newer Prefect than the one installed: Prefect migrates from nothing.
    newer = tmp_path / "newer.sql"
    newer.write_text(fresh_db.DUMP.read_text().replace("-- head: ", "-- head: 0000", 1))
    monkeypatch.setattr(fresh_db, "DUMP", newer)
    assert not fresh_db.create(tmp_path / "other" / "prefect.db")
    assert not (tmp_path / "other" / "prefect.db").exists()


def test_only_a_database_that_nothing_but_prefect_home_places_is_made_for_prefect_server_start(tmp_path):
    home = tmp_path / "home"
    assert fresh_db.default_path({"PREFECT_HOME": str(home)}) == home / "prefect.db"
    for name in ("PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL",
                 "PREFECT_SERVER_DATABASE_DRIVER", "PREFECT_SERVER_DATABASE_NAME"):
        assert fresh_db.default_path({"PREFECT_HOME": str(home), name: "x"}) is None
    home.mkdir()
    (home / "profiles.toml").write_text('[profiles.pg]\nPREFECT_API_DATABASE_CONNECTION_URL = "postgresql+asyncpg://x"\n')
    assert fresh_db.default_path({"PREFECT_HOME": str(home)}) is None
    assert not fresh_db.create_default({"PREFECT_HOME": str(home)}) and not (home / "prefect.db").exists()
    assert fresh_db.create_default({"PREFECT_HOME": str(tmp_path / "plain")})
    assert fresh_db.is_current(tmp_path / "plain" / "prefect.db")

    assert fresh_db.sqlite_path(f"sqlite+aiosqlite:///{home}/prefect.db") == home / "prefect.db"
    for url in ("postgresql+asyncpg://u:p@h/db", "sqlite+aiosqlite:///:memory:",
                "sqlite+aiosqlite:///file:x?mode=memory&cache=shared&uri=true"):
        assert fresh_db.sqlite_path(url) is None


def test_labruns_api_starts_on_the_dump_and_leaves_the_block_types_to_prefects_own_server(tmp_path):
    home = tmp_path / "home"
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    api = start_api(port, server_env(url, prefect_env(home)), tmp_path / "api.log")
    try:
        wait_healthy(url, api, tmp_path / "api.log")
    finally:
        stop(api)
    assert fresh_db.is_current(home / "prefect.db")
    db = sqlite3.connect(home / "prefect.db")
    assert db.execute("SELECT count(*) FROM block_type").fetchone() == (0,)
    # No memo either: it would tell `prefect server start` that the block types are registered.
    assert not (home / "memo_store.toml").exists()
