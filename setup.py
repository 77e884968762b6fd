"""Lists labrun's packages for setuptools (pyproject.toml holds everything else): each folder
under the mapped roots is a package, so that its templates travel as package data."""

from pathlib import Path

from setuptools import setup

ROOTS = {"labrun": "labrun", "labrun.phases": "phases", "labrun.flows": "flows",
         "labrun.templates": "templates", "labrun.examples": "examples"}


def tree(name: str, folder: str) -> list[str]:
    here = Path(__file__).parent / folder
    return [name] + [f"{name}." + ".".join(p.relative_to(here).parts)
                     for p in sorted(here.rglob("*")) if p.is_dir() and p.name != "__pycache__"]


setup(packages=[pkg for name, folder in ROOTS.items() for pkg in tree(name, folder)])
