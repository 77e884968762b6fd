"""Where labrun's data folders are: `templates/` and `examples/` sit beside `labrun/` in a
clone (the repository's layout) and inside it in an installed wheel (pyproject maps them)."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def resource(name: str) -> Path:
    inside = _PACKAGE / name
    return inside if inside.exists() else _PACKAGE.parent / name


TEMPLATES = resource("templates")
EXAMPLES = resource("examples")
