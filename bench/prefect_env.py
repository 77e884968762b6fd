"""What the bench scripts set before they import Prefect: a throwaway Prefect home, no
telemetry (offline, it prints a traceback), time for a first server start, quiet logs."""

import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="labrun-bench-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ["PREFECT_LOGGING_LEVEL"] = "WARNING"
