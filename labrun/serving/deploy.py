"""`prefect deploy --all` from labrun's prefect.yaml.

In a clone prefect.yaml sits at the repository's root beside `flows/`; an installed wheel
carries the same file as `labrun/prefect.yaml` beside `labrun/flows/` (setup.py puts it
there), so its entrypoints (`flows/session.py:...`) hold in both, and the deployment runs
the flows from the folder it was deployed from.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from labrun.resources import resource
from labrun.serving import ServerError
from labrun.serving.processes import prefect_cli


def deployment_root() -> Path:
    """The folder that holds prefect.yaml and the `flows/` it names."""
    return resource("prefect.yaml").parent


def deploy(env: dict[str, str] | None = None, root: Path | None = None) -> str:
    """Returns `prefect deploy`'s output."""
    root = root or deployment_root()
    if not (root / "prefect.yaml").is_file():
        raise ServerError(f"{root}/prefect.yaml is missing: reinstall labrun")
    proc = subprocess.run(
        [*prefect_cli(), "--no-prompt", "deploy", "--all"],
        cwd=root, env=env, capture_output=True, text=True, timeout=600,
    )
    if proc.returncode != 0:
        raise ServerError(f"`prefect deploy --all` failed in {root}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc.stdout
