"""`prefect deploy --all` from labrun's prefect.yaml.

In a clone prefect.yaml sits at the repository's root; an installed wheel carries the same
file as `labrun/prefect.yaml` (setup.py puts it there). Its entrypoints are module paths
(`labrun.flows.session.research_session`), so a worker imports the installed flows from
any working directory. The deployments' working directory is the clone, or for a wheel the
folder `labrun server` runs in (never the package folder itself, where labrun's modules
would shadow the standard library's `secrets`).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from labrun.resources import resource
from labrun.prefect_processes import ServerError, prefect_cli


def deployment_file() -> Path:
    return resource("prefect.yaml")


def working_directory() -> Path:
    here = deployment_file().parent
    return Path.cwd() if (here / "__init__.py").exists() else here


def deploy(env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """Returns `prefect deploy`'s output."""
    prefect_file, cwd = deployment_file(), cwd or working_directory()
    if not prefect_file.is_file():
        raise ServerError(f"{prefect_file} is missing: reinstall labrun")
    proc = subprocess.run(
        [*prefect_cli(), "--no-prompt", "deploy", "--all", "--prefect-file", str(prefect_file)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )
    if proc.returncode != 0:
        raise ServerError(f"`prefect deploy --all` of {prefect_file} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc.stdout
