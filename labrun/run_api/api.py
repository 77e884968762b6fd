"""Which Prefect API a `labrun run` talks to, decided without importing Prefect.

A server already running is used as it is (`labrun.serving.address`): the one
PREFECT_API_URL names, else the one `labrun server` started. Only without one does the
run start an API, at once and in the background, while labrun imports the engine: the one
kept between runs (`labrun.run_api.kept`), or with LABRUN_KEEP_API=0 one for this run
alone, stopped when the run ends and dying with labrun in any case.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from labrun.prefect_processes import (ServerError, free_port, healthy, new_database, prefect_home, server_env, stop,
                                      wait_healthy)
from labrun.run_api import kept as kept_api
from labrun.run_api.process import start_api
from labrun.serving.address import configured_api_url, labrun_server_url

if TYPE_CHECKING:
    import psutil


@dataclass
class RunApi:
    """The API of one run; `proc` is set when this run started it for itself alone, `kept`
    (its psutil process, identified by pid and start time) when it is the API kept between
    runs."""

    url: str
    proc: subprocess.Popen | None = None
    log: Path | None = None
    origin: str = ""
    kept: "psutil.Process | None" = None
    lease: int | None = None
    """This run's lease on the kept API (`kept_api.hold_lease`)."""
    reused: bool = False
    """Running before this run came."""
    new_database: bool = False
    """Started on a Prefect home without a database: Prefect migrates one first."""

    def announcement(self) -> str:
        if self.reused:
            return f"using the Prefect API at {self.url} ({self.origin})"
        if self.new_database:  # tens of seconds with no other output: say what they are
            return (f"starting Prefect's API ({self.origin}); a new Prefect home, so the first run takes "
                    "longer: Prefect builds its database")
        return f"starting a Prefect API ({self.origin})"

    @classmethod
    def find_or_start(cls) -> "RunApi":
        minutes = kept_api.idle_minutes()
        lease = kept_api.hold_lease() if minutes > 0 else None  # for the rest of this process
        url = configured_api_url()
        if url:
            return cls(url, origin="PREFECT_API_URL", lease=lease, reused=True)
        url = labrun_server_url()
        if url:
            return cls(url, origin="labrun server", lease=lease, reused=True)
        if minutes > 0:
            new = new_database()
            url, proc, started = kept_api.find_or_start(minutes)
            if started:
                return cls(url, log=kept_api.log_path(), kept=proc, lease=lease, new_database=new,
                           origin=f"kept for later runs until unused for {minutes:g} minutes; LABRUN_KEEP_API=0: "
                                  "one for each run")
            return cls(url, log=kept_api.log_path(), kept=proc, lease=lease, origin="kept between runs", reused=True)
        port = free_port()
        url = f"http://127.0.0.1:{port}/api"
        log = prefect_home() / "labrun" / "api.log"
        return cls(url, start_api(port, server_env(url), log), log, new_database=new_database(),
                   origin="for this run; no server is running, `labrun server` keeps one")

    def wait(self) -> None:
        """Until it answers; one line says what is wrong when it does not."""
        if self.proc is not None or self.kept is not None:
            wait_healthy(self.url, self.proc or self.kept, self.log)
        elif not healthy(self.url, timeout_s=5):
            raise ServerError(f"the Prefect API at {self.url} ({self.origin}) does not answer; start it "
                              "(`labrun server`), or unset PREFECT_API_URL to let labrun start its own")

    def interrupted(self, grace_s: float = 1.0) -> None:
        """The run was interrupted: nothing it started may outlive it, so the kept API goes
        too unless another run is using it."""
        if self.lease is not None:
            kept_api.stop_unless_used(self.lease, grace_s)

    def kill(self) -> None:
        """At once (a second Ctrl-C)."""
        self.interrupted(grace_s=0)
        if self.proc is not None:
            try:  # its own group, this process's child, not reaped: the pid is still its own
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, grace_s=5, first=signal.SIGTERM)  # uvicorn finishes its requests and exits
            self.proc = None
