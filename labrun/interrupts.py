"""Stopping on SIGINT and SIGTERM: the first one unwinds the session (Prefect records the
crash, STATE.md says what stopped it, the processes labrun started are stopped); a second
one ends labrun at once.

A terminal's Ctrl-C reaches its whole foreground process group. Everything labrun starts
runs in a session of its own (the Prefect API, experiment commands), so the signal reaches
labrun alone, and labrun stops them itself.
"""

from __future__ import annotations

import ctypes
import os
import signal
from contextlib import contextmanager
from functools import lru_cache
from typing import Callable, Iterator

NAMES = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Interrupted(KeyboardInterrupt):
    """The session was stopped by a signal; `reason` names it in plain words."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(NAMES.get(signum, f"signal {signum}"))
        self.signum = signum

    @property
    def reason(self) -> str:
        return self.args[0]

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.signum, 128 + self.signum)


PR_SET_PDEATHSIG = 1


@lru_cache(maxsize=1)
def _prctl():
    return ctypes.CDLL(None, use_errno=True).prctl


def dies_with_labrun() -> Callable[[], None]:
    """A `preexec_fn` for a child that must not outlive labrun, even after a `kill -9`: it
    gets SIGKILL when the thread that started it ends (so start it from the main thread, or
    from the thread it belongs to), and exits at once if labrun went before that was set."""
    parent = os.getpid()
    prctl = _prctl()  # resolved here, not in the forked child

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
    return preexec


_on_hard_exit: list[Callable[[], None]] = []


def on_hard_exit(cleanup: Callable[[], None]) -> None:
    """Run `cleanup` (quick: kill a process group) if a second signal ends labrun at once."""
    _on_hard_exit.append(cleanup)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """In the main thread: SIGINT and SIGTERM raise `Interrupted`; a second one exits."""
    def second(signum, frame):
        for cleanup in reversed(_on_hard_exit):
            try:
                cleanup()
            except Exception:
                pass
        os.write(2, b"labrun: stopped at once (second signal)\n")
        os._exit(EXIT_CODES.get(signum, 128 + signum))

    def first(signum, frame):
        signal.signal(signal.SIGINT, second)
        signal.signal(signal.SIGTERM, second)
        raise Interrupted(signum)

    previous = {s: signal.signal(s, first) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _on_hard_exit.clear()
