"""Server mode (docs/design.md): sessions as deployment runs on the `labrun` process work pool.

- `prepare`: the pool, its `sessions` work queue, the `labrun-model-api` global concurrency
  limit and the automation that marks a silent run Crashed;
- `deploy`: `prefect deploy --all` from labrun's `prefect.yaml` (in a clone or a wheel);
- `processes`: starting and stopping local Prefect servers and workers;
- `api`: the Prefect API of a `labrun run` (one running already, else `kept_api`'s);
- `api_process`: the process of an API that labrun starts for its runs;
- `submit`: one session run per idea, each with a workspace of its own.

The names below are what prefect.yaml and the UI know labrun's objects by. Importing this
package does not import Prefect.
"""

import os
from pathlib import Path

POOL = "labrun"
SESSION_QUEUE = "sessions"
SESSION_DEPLOYMENT = "research-session/default"
QUEUE_DEPLOYMENT = "experiment-queue/ideas-folder"
ZOMBIE_AUTOMATION = "labrun: mark runs Crashed when their heartbeats stop"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4200
DEFAULT_SESSION_SLOTS = 4
DEFAULT_CRASH_AFTER_S = 90
"""Three missed heartbeats at the 30 s that prefect.yaml sets."""
CLIENT_MAX_RETRIES = 10
"""On SQLite a burst of writers can keep the database locked through a client's default five
retries (about a minute); ten wait out bursts of half an hour."""


class ServerError(Exception):
    """A one-line reason, and what to do about it."""


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()


def new_database(env: dict[str, str] | None = None) -> bool:
    """Whether a Prefect API started with `env` (this process's environment by default) makes
    its database first: no setting names a database, and PREFECT_HOME has none yet. Prefect's
    migrations then take most of a first start, with nothing else to show."""
    env = os.environ if env is None else env
    if any(k.startswith(("PREFECT_SERVER_DATABASE_", "PREFECT_API_DATABASE_")) for k in env):
        return False
    home = Path(env.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
    profiles = Path(env.get("PREFECT_PROFILES_PATH") or home / "profiles.toml").expanduser()
    try:
        if "DATABASE" in profiles.read_text():  # a profile may name another database: say nothing
            return False
    except OSError:
        pass
    return not (home / "prefect.db").exists()
