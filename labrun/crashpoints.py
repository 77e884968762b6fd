"""Named instants at which the crash-campaign tests kill the engine.

`LABRUN_CRASH_AT=<name>:<n>` makes the n-th arrival at `crashpoint(<name>)` in this process
SIGKILL the process, so a test can hit windows too narrow for a timer (between a model reply
and its tool results, between a STATE.md temp file and its rename). Unset, it costs one
environment lookup.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

_arrivals: Counter[str] = Counter()


def crashpoint(name: str) -> None:
    spec = os.environ.get("LABRUN_CRASH_AT")
    if not spec:
        return
    target, _, nth = spec.partition(":")
    if target != name:
        return
    _arrivals[name] += 1
    if _arrivals[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
