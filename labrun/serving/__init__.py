"""Server mode (docs/design.md): sessions as deployment runs on the `labrun` process work pool.

- `prepare`: the pool, its `sessions` work queue, the `labrun-model-api` global concurrency
  limit, the automation that marks a silent run Crashed, and (`--notify`) the one that posts
  to a webhook when a session completes, fails or awaits review;
- `deploy`: `prefect deploy --all` from labrun's `prefect.yaml` (in a clone or a wheel);
- `address`: where a running server is (PREFECT_API_URL, or the one `labrun server` started);
- `submit`: one session run per idea, each with a workspace of its own;
- `pools`: the work pool a session's experiment attempts run on, checked, and the deployment
  of the attempt flow on it.
- `slurm_worker`: the `labrun-slurm` Prefect worker type (imports Prefect; Prefect loads it).

The processes of a server and its workers are in `labrun.prefect_processes`. The names below
are what prefect.yaml and the UI know labrun's objects by. Importing this package does not
import Prefect.
"""

POOL = "labrun"
SESSION_QUEUE = "sessions"
SESSION_DEPLOYMENT = "research-session/default"
QUEUE_DEPLOYMENT = "experiment-queue/ideas-folder"
ZOMBIE_AUTOMATION = "labrun: mark runs Crashed when their heartbeats stop"
NOTIFY_AUTOMATION = "labrun: notify when a session completes, fails or awaits review"
NOTIFY_BLOCK = "labrun-notify"
SESSION_FLOW = "research-session"
ATTEMPT_FLOW = "experiment-attempt"
"""The flow of one experiment attempt on a work pool; its deployment on pool P is
`experiment-attempt/P`, made on demand (`labrun.serving.pools`)."""
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4200
DEFAULT_SESSION_SLOTS = 4
DEFAULT_CRASH_AFTER_S = 90
"""Three missed heartbeats at the 30 s that prefect.yaml sets."""
CLIENT_MAX_RETRIES = 10
"""On SQLite a burst of writers can keep the database locked through a client's default five
retries (about a minute); ten wait out bursts of half an hour."""
