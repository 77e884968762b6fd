"""Where a running Prefect server is, decided without importing Prefect: the one
PREFECT_API_URL names (in the environment or the active Prefect profile), else the one
`labrun server` started, which leaves its address in PREFECT_HOME/labrun/server.json while
it runs."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

from labrun.prefect_processes import healthy, prefect_home, profiles_path


def server_record() -> Path:
    return prefect_home() / "labrun" / "server.json"


def configured_api_url() -> str | None:
    """PREFECT_API_URL from the environment, else from the active Prefect profile."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    try:
        profiles = tomllib.loads(profiles_path().read_text())
    except (OSError, ValueError):
        return None
    active = os.environ.get("PREFECT_PROFILE") or profiles.get("active", "ephemeral")
    return (profiles.get("profiles", {}).get(active) or {}).get("PREFECT_API_URL") or None


def labrun_server_url() -> str | None:
    """The API of a `labrun server` running on this machine with this PREFECT_HOME."""
    try:
        record = json.loads(server_record().read_text())
        return record["api_url"] if healthy(record["api_url"], timeout_s=1) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
