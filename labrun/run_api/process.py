"""The process of the Prefect API that labrun starts for one run: Prefect's API in its
ephemeral mode, as Prefect starts one for a flow run without a server (no UI, only the
services a run needs), on 127.0.0.1. Prefect makes and migrates its own database, as at any
start.

    python -m labrun.run_api.process PORT
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from labrun.prefect_processes import spawn
from labrun.serving import DEFAULT_HOST


def start_api(port: int, env: dict[str, str], log: Path):
    """Prefect's API alone, for one run, on 127.0.0.1:`port`: a session of its own that dies
    with labrun (`spawn`)."""
    return spawn([sys.executable, "-m", "labrun.run_api.process", str(port)], env, log)


def main() -> None:
    port = int(sys.argv[1])
    os.environ.update({"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"})

    import uvicorn

    uvicorn.Server(uvicorn.Config("prefect.server.api.server:create_app", factory=True, host=DEFAULT_HOST,
                                  port=port, log_level="error", lifespan="on")).run()


if __name__ == "__main__":
    main()
