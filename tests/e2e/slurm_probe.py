"""The flow that tests/e2e/test_slurm.py deploys on a `labrun-slurm` pool: it notes, one line
a run, which Slurm job ran it and the GPUs Slurm gave it, then waits."""

import os
import time
from pathlib import Path

from prefect import flow


@flow(name="slurm-probe")
def slurm_probe(out: str, seconds: float = 0.0) -> str:
    job = os.environ.get("SLURM_JOB_ID", "")
    with open(Path(out), "a") as f:
        f.write(f"{job} {os.environ.get('CUDA_VISIBLE_DEVICES', '-')}\n")
    time.sleep(seconds)
    return job
