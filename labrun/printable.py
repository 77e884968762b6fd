"""Text the agent chose (a file's name, its command's output), made safe to print at a
terminal: the command line's every such print, and a running attempt's log lines in every
view (`labrun.live`), pass here."""

from __future__ import annotations

import re

CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
"""C0 and C1 control characters, and the lone surrogates a name's bytes that are not UTF-8 become."""


def printable(text: str, multiline: bool = False) -> str:
    """`text` safe to print at a terminal: each C0 and C1 control character (ESC, which
    starts a sequence that recolours, retitles or rewrites the screen; a carriage return)
    written as an escape, `\\x1b`, as is a byte of a name that is not UTF-8; with
    `multiline`, newlines and tabs are kept."""
    def escaped(m: re.Match[str]) -> str:
        c = ord(m[0])
        return m[0] if multiline and m[0] in "\n\t" else f"\\x{c & 0xff:02x}" if c < 0x100 or c >= 0xdc80 else f"\\u{c:04x}"
    return CONTROL.sub(escaped, text)
