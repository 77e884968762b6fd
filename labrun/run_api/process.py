"""The process of a Prefect API that labrun starts for its runs (one run's own, or the one
kept between them): Prefect's API in its ephemeral mode, as Prefect starts one for a flow run
without a server (no UI, only the services a run needs), on 127.0.0.1. Prefect makes and
migrates its own database, as at any start.

    python -m labrun.run_api.process PORT [IDLE_MINUTES]

With IDLE_MINUTES it is the kept API, which exits once no run has used it for that long
(`labrun.run_api.kept`).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from labrun.prefect_processes import spawn
from labrun.serving import DEFAULT_HOST


def start_api(port: int, env: dict[str, str], log: Path):
    """Prefect's API alone, for one run, on 127.0.0.1:`port`."""
    return spawn([sys.executable, "-m", "labrun.run_api.process", str(port)], env, log)


def main() -> None:
    port = int(sys.argv[1])
    idle_minutes = float(sys.argv[2]) if len(sys.argv) > 2 else None
    os.environ.update({"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"})

    import uvicorn

    server = uvicorn.Server(uvicorn.Config("prefect.server.api.server:create_app", factory=True,
                                           host=DEFAULT_HOST, port=port, log_level="error", lifespan="on"))
    if idle_minutes is not None:
        from labrun.run_api.kept import go_when_idle

        threading.Thread(target=go_when_idle, args=(server, idle_minutes * 60), daemon=True).start()
    server.run()


if __name__ == "__main__":
    main()
