"""Where labrun's data folders are: `templates/` and `examples/` sit beside `labrun/` in a
clone (the repository's layout) and inside it in an installed wheel (pyproject maps them)."""

from __future__ import annotations

import functools
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def resource(name: str) -> Path:
    inside = _PACKAGE / name
    return inside if inside.exists() else _PACKAGE.parent / name


TEMPLATES = resource("templates")
EXAMPLES = resource("examples")


@functools.cache
def template_cache(kind: str = "jinja2"):
    """Compiled templates kept between runs (Jinja's cache in the user's temporary folder,
    keyed by each template's source): compiling them anew costs a run about half a second.
    `kind`: one per environment whose options change the compiled code (STATE.md's
    `finalize`), since the key holds the source alone."""
    from jinja2 import FileSystemBytecodeCache

    return FileSystemBytecodeCache(pattern=f"__{kind}_%s.cache")
