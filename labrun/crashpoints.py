"""Named instants at which the crash-campaign tests kill the engine.

`LABRUN_CRASH_AT=<name>:<n>` makes the n-th arrival at `crashpoint(<name>)` in this process
SIGKILL the process, so a test can hit windows too narrow for a timer (inside a model call,
between a model reply's arrival and its journal record, between a reply and its tool results,
between a STATE.md temp file and its rename, at each phase-table write). Unset, it costs one
look at the environment (`labrun.settings`).

`result-write:<n>` reaches inside Prefect: the n-th record Prefect writes to a local result
store (the commit of a cached phase or attempt) is torn, half its bytes on disk, and the
process killed, as a kill in the middle of Prefect's own write would leave it.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

from labrun.settings import BadSetting, settings

_arrivals: Counter[str] = Counter()


def _target() -> tuple[str, int] | None:
    spec = settings().crash_at
    if not spec:
        return None
    name, _, nth = spec.partition(":")
    return name, int(nth or 1)


def crashpoint(name: str) -> None:
    target = _target()
    if target is None or target[0] != name:
        return
    _arrivals[name] += 1
    if _arrivals[name] == target[1]:
        os.kill(os.getpid(), signal.SIGKILL)


def _tear_result_writes() -> None:
    from prefect.filesystems import LocalFileSystem

    whole = LocalFileSystem.write_path

    def write_path(self, path, content, **kwargs):
        if _arrivals["result-write"] + 1 == _target()[1]:
            torn = self._resolve_path(path)
            torn.parent.mkdir(parents=True, exist_ok=True)
            with open(torn, "wb") as f:
                f.write(content[: len(content) // 2])
                f.flush()
                os.fsync(f.fileno())
        crashpoint("result-write")
        return whole(self, path, content, **kwargs)

    LocalFileSystem.write_path = write_path


def arm() -> None:
    """Reach into Prefect if LABRUN_CRASH_AT asks for it: done at import, and again by a
    process forked after the import with its own LABRUN_CRASH_AT (tests/engine_forker.py)."""
    _arrivals.clear()
    try:
        target = _target()
    except BadSetting:
        return  # the command line says which, before it runs anything
    if (target or ("",))[0] == "result-write":
        _tear_result_writes()


arm()
