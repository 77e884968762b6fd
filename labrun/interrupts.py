"""Stopping on a signal: SIGINT (Ctrl-C), SIGTERM, SIGHUP (its terminal closed, an SSH
connection dropped) and SIGPIPE (its output piped into a reader that has gone, as in
`labrun run … | head -5`). The first unwinds the session (Prefect records the crash,
STATE.md says what stopped it, the processes labrun started are stopped); a second one ends
labrun at once. Output that has nowhere to go after a hang-up or a closed pipe is dropped,
so that the clean path does not fail on its own messages.

A terminal's Ctrl-C reaches its whole foreground process group. Everything labrun starts
runs in a session of its own (the Prefect API, experiment commands), so the signal reaches
labrun alone, and labrun stops them itself.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
from contextlib import contextmanager
from functools import lru_cache
from typing import Callable, Iterator

NAMES = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM",
         signal.SIGHUP: "a hang-up (SIGHUP: its terminal closed)",
         signal.SIGPIPE: "a closed output pipe (SIGPIPE)"}
SIGNALS = tuple(NAMES)
EXIT_CODES = {s: 128 + s for s in SIGNALS}  # as a shell reports a process the signal ended


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


def mute_closed_outputs() -> None:
    """Point stdout and stderr at /dev/null where their reader is gone (a closed pipe, a
    terminal hung up): a write there would raise, or stop labrun with SIGPIPE."""
    devnull = None
    for fd in (1, 2):
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        try:
            gone = any(mask & (select.POLLERR | select.POLLHUP) for _, mask in poll.poll(0))
        except OSError:
            gone = True
        if gone:
            devnull = os.open(os.devnull, os.O_WRONLY) if devnull is None else devnull
            os.dup2(devnull, fd)
    if devnull is not None:
        os.close(devnull)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """In the main thread: each of `SIGNALS` raises `Interrupted`; a second one exits.
    Python ignores SIGPIPE (a write to a closed pipe raises instead); here it is a signal
    like the others, so that a closed pipe stops the session the way SIGTERM does."""
    def second(signum, frame):
        mute_closed_outputs()
        for cleanup in reversed(_on_hard_exit):
            try:
                cleanup()
            except Exception:
                pass
        os.write(2, b"labrun: stopped at once (second signal)\n")
        os._exit(EXIT_CODES.get(signum, 128 + signum))

    def first(signum, frame):
        for s in SIGNALS:
            signal.signal(s, second if s != signal.SIGPIPE else signal.SIG_IGN)  # writes may still fail
        mute_closed_outputs()
        raise Interrupted(signum)

    previous = {s: signal.signal(s, first) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _on_hard_exit.clear()
