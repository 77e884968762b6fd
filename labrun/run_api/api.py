"""Which Prefect API a `labrun run` talks to, decided without importing Prefect.

A server already running is used as it is (`labrun.serving.address`): the one
PREFECT_API_URL names, else the one `labrun server` started (kept on purpose). Only without
one does the run start an API of its own, at once and in the background, while labrun
imports the engine. That API lives as long as the run: stopped when the run ends, however it
ends, and dying with labrun even after a `kill -9` (`labrun.prefect_processes.spawn`).

The run's end goes in one order (`RunApi.close`): labrun's own work has stopped; Prefect's
clients in this process (run logs, events) send what they hold, for a bounded time; then
the API this run started stops. No client is left to wait on an API that is gone.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from labrun.prefect_processes import ServerError, free_port, healthy, new_database, prefect_home, server_env, stop, \
    wait_healthy
from labrun.run_api.process import start_api
from labrun.serving import DEFAULT_HOST
from labrun.serving.address import configured_api_url, labrun_server_url

FLUSH_S = 3.0
"""How long Prefect's clients get, at the run's end, to send what they hold."""


@dataclass
class RunApi:
    """The API of one run; `proc` is set when this run started it."""

    url: str
    proc: subprocess.Popen | None = None
    log: Path | None = None
    origin: str = ""
    new_database: bool = False
    """Started on a Prefect home without a database: Prefect migrates one first."""

    def announcement(self) -> str:
        if self.proc is None:
            return f"using the Prefect API at {self.url} ({self.origin})"
        if self.new_database:  # tens of seconds with no other output: say what they are
            return (f"starting Prefect's API ({self.origin}); a new Prefect home, so the first run takes "
                    "longer: Prefect builds its database")
        return f"starting a Prefect API ({self.origin})"

    @classmethod
    def find_or_start(cls) -> "RunApi":
        url = configured_api_url()
        if url:
            return cls(url, origin="PREFECT_API_URL")
        url = labrun_server_url()
        if url:
            return cls(url, origin="labrun server")
        port = free_port()
        url = f"http://{DEFAULT_HOST}:{port}/api"
        log = prefect_home() / "labrun" / "api.log"
        return cls(url, start_api(port, server_env(url), log), log, new_database=new_database(),
                   origin="for this run; no server is running, `labrun server` keeps one")

    def use(self) -> None:
        """Every Prefect client of this process talks to this API. Prefect reads its settings
        when it is imported; an agent's check may have imported it before the API was chosen
        (the coding-CLI backends do), and Prefect would then start an API of its own, in
        labrun's process group, which a Ctrl-C kills under the run's clients."""
        os.environ["PREFECT_API_URL"] = self.url
        # As prefect.yaml sets for deployments: a labrun server's zombie automation
        # expects a heartbeat every 30 s (Prefect's default is 180), and marks a run
        # that sends none for 90 s Crashed.
        os.environ.setdefault("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "30")
        if "prefect.context" in sys.modules:
            from prefect.context import refresh_global_settings_context

            refresh_global_settings_context()

    def wait(self) -> None:
        """Until it answers; one line says what is wrong when it does not."""
        if self.proc is not None:
            wait_healthy(self.url, self.proc, self.log)
        elif not healthy(self.url, timeout_s=5):
            raise ServerError(f"the Prefect API at {self.url} ({self.origin}) does not answer; start it "
                              "(`labrun server`), or unset PREFECT_API_URL to let labrun start its own")

    def kill(self) -> None:
        """At once (a second Ctrl-C)."""
        if self.proc is not None:
            try:  # its own group, this process's child, not reaped: the pid is still its own
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """At the run's end, however it ended, once labrun's own work has stopped: Prefect's
        clients send what they hold, then the API goes with the run."""
        close_prefect_clients(FLUSH_S)
        self.stop()

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, grace_s=5, first=signal.SIGTERM)  # uvicorn finishes its requests and exits
            self.proc = None


def close_prefect_clients(timeout_s: float) -> None:
    """Prefect's background clients in this process (run logs, then events: a log's send can
    emit one) send what they hold, `timeout_s` at most in all; what is left then is dropped,
    saying so. Otherwise the interpreter's exit waits on them without bound, each retrying
    an API that is gone (an event ten reconnections, a batch of logs ten back-offs)."""
    if "prefect" not in sys.modules:
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    deadline = time.monotonic() + timeout_s
    for service in (APILogWorker, EventsWorker):
        # Prefect drains with a timeout but has no way to give up; a service that outlives
        # its drain is cancelled on its loop, which ends it as a failure would.
        running = [(s, s._loop, s._task) for s in list(service._instances.values())]
        service.drain_all(timeout=max(deadline - time.monotonic(), 0.1), at_exit=False)
        for s, loop, task in running:
            if loop is not None and task is not None and not task.done():
                logging.getLogger("labrun").warning(
                    "Prefect's API did not take all of this run's %s within %.0f s; the rest is dropped",
                    "logs" if service is APILogWorker else "events", timeout_s)
                loop.call_soon_threadsafe(task.cancel)
