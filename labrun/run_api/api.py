"""Which Prefect API a `labrun run` talks to, decided without importing Prefect.

A server already running is used as it is (`labrun.serving.address`): the one
PREFECT_API_URL names, else the one `labrun server` started (kept on purpose). Only without
one does the run start an API of its own, at once and in the background, while labrun
imports the engine. That API lives as long as the run: stopped when the run ends, however it
ends, and dying with labrun even after a `kill -9` (`labrun.prefect_processes.spawn`).
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from labrun.prefect_processes import ServerError, free_port, healthy, new_database, prefect_home, server_env, stop, \
    wait_healthy
from labrun.run_api.process import start_api
from labrun.serving import DEFAULT_HOST
from labrun.serving.address import configured_api_url, labrun_server_url


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

    def stop(self) -> None:
        """At the run's end, however it ended: the API goes with it."""
        if self.proc is not None:
            stop(self.proc, grace_s=5, first=signal.SIGTERM)  # uvicorn finishes its requests and exits
            self.proc = None
