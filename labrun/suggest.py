"""The line that refuses an unknown name: the nearest known one, when one is near, and the list."""

from __future__ import annotations

import difflib
from typing import Iterable


def unknown(kind: str, value: str, known: Iterable[str], plural: str | None = None, listed: bool = True) -> str:
    """`unknown agent 'codx' (did you mean 'codex'?); the agents are: anthropic, ...` (without
    the list when not `listed`: a long one)."""
    known = list(known)
    listing = f"; the {plural or kind + 's'} are: {', '.join(known)}" if listed else ""
    return f"unknown {kind} {value!r}{hint(value, known)}{listing}"


def hint(value: str, known: Iterable[str]) -> str:
    """` (did you mean 'codex'?)` when a known name is near `value`, else nothing."""
    near = difflib.get_close_matches(str(value), list(known), n=1, cutoff=0.6)
    return f" (did you mean {near[0]!r}?)" if near else ""
