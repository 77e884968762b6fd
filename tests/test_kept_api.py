"""The kept API's record names its process by pid and start time (`labrun.run_api.kept`):
a record whose pid now belongs to another process (after a reboot, or a `kill -9` of the
kept API and the pid's reuse) is stale, and labrun never signals that process.

The other process is a real `sleep` this test starts; only its record's start time differs.
"""

from __future__ import annotations

import json
import os
import subprocess

import psutil
import pytest

from labrun.run_api import kept as kept_api


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def lease(home):
    """This test's lease, as a run holds it."""
    fd = kept_api.hold_lease()
    yield fd
    os.close(fd)


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def write_record(pid: int, **fields) -> None:
    kept_api.record_path().write_text(json.dumps({"api_url": "http://127.0.0.1:9/api", "pid": pid, **fields}))


@pytest.mark.parametrize("started", ["wrong", "missing"])
def test_a_record_whose_pid_names_another_process_is_stale_and_that_process_is_not_signalled(
        started, lease, sleeper):
    real = psutil.Process(sleeper.pid).create_time()
    write_record(sleeper.pid, **({"started": real - 3600} if started == "wrong" else {}))
    assert kept_api.read_record() is None
    kept_api.stop_unless_used(lease, grace_s=0.5)  # an interrupted run, alone
    assert sleeper.poll() is None, "labrun signalled a process that its record did not name"


def test_a_record_that_names_its_process_is_read_and_an_interrupted_run_stops_it(lease, sleeper):
    """The same record with the right start time: so the check above is what spared the sleep."""
    write_record(sleeper.pid, started=psutil.Process(sleeper.pid).create_time())
    assert kept_api.read_record()["pid"] == sleeper.pid
    kept_api.stop_unless_used(lease, grace_s=5)
    assert sleeper.wait(5) == -15  # SIGTERM
    assert not kept_api.record_path().exists()


def test_another_runs_lease_keeps_the_kept_api(lease, sleeper):
    write_record(sleeper.pid, started=psutil.Process(sleeper.pid).create_time())
    mine = kept_api.hold_lease()  # `lease` is another run's: a lock on an open file of its own
    try:
        kept_api.stop_unless_used(mine, grace_s=0.5)
    finally:
        os.close(mine)
    assert sleeper.poll() is None and kept_api.read_record() is not None
