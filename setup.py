"""Lists labrun's packages for setuptools (pyproject.toml holds everything else): each folder
under the mapped roots is a package, so that its templates travel as package data. The
repository's prefect.yaml goes into the wheel as labrun/prefect.yaml, beside labrun/flows/,
so that `labrun server` deploys an installed labrun the way `prefect deploy` deploys a clone."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent
ROOTS = {"labrun": "labrun", "labrun.phases": "phases", "labrun.flows": "flows",
         "labrun.templates": "templates", "labrun.examples": "examples"}


def tree(name: str, folder: str) -> list[str]:
    here = HERE / folder
    return [name] + [f"{name}." + ".".join(p.relative_to(here).parts)
                     for p in sorted(here.rglob("*")) if p.is_dir() and p.name != "__pycache__"]


class BuildWithDeployments(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:  # an editable install deploys from the clone itself
            self.copy_file(str(HERE / "prefect.yaml"), str(Path(self.build_lib) / "labrun" / "prefect.yaml"))


setup(packages=[pkg for name, folder in ROOTS.items() for pkg in tree(name, folder)],
      cmdclass={"build_py": BuildWithDeployments})
