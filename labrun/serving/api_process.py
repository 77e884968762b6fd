"""The process of a Prefect API that labrun starts for its runs (one run's own, or the one
kept between them): Prefect's API in its ephemeral mode, as Prefect starts one for a flow run
without a server (no UI, only the services a run needs), on 127.0.0.1.

    python -m labrun.serving.api_process PORT [IDLE_MINUTES]

With IDLE_MINUTES it is the kept API, which exits once no run has used it for that long
(`labrun.serving.kept_api`). A new home's database is loaded from the schema dump
(`labrun.serving.fresh_db`) rather than migrated.
"""

from __future__ import annotations

import os
import sys
import threading

from labrun.serving import DEFAULT_HOST, fresh_db


def main() -> None:
    port = int(sys.argv[1])
    idle_minutes = float(sys.argv[2]) if len(sys.argv) > 2 else None
    os.environ.update({"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"})

    from prefect import settings

    database = fresh_db.sqlite_path(settings.get_current_settings().server.database.connection_url.get_secret_value())
    if database is not None:
        fresh_db.create(database)
    # Prefect checks at each start that its block types are registered, 1-3 s. A run needs
    # none (a block that code saves registers its own type) and `prefect server start`, the
    # UI's server, registers them all; so neither that nor its memo, which would tell such a
    # server that they are.
    this_start = {settings.PREFECT_API_BLOCKS_REGISTER_ON_START: False,
                  settings.PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION: False}
    if database is not None and fresh_db.is_current(database):
        this_start[settings.PREFECT_API_DATABASE_MIGRATE_ON_START] = False

    import uvicorn

    server = uvicorn.Server(uvicorn.Config("prefect.server.api.server:create_app", factory=True,
                                           host=DEFAULT_HOST, port=port, log_level="error", lifespan="on"))
    if idle_minutes is not None:
        from labrun.serving.kept_api import go_when_idle

        threading.Thread(target=go_when_idle, args=(server, idle_minutes * 60), daemon=True).start()
    with settings.temporary_settings(this_start):
        server.run()


if __name__ == "__main__":
    main()
