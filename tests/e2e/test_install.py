"""A real install: the wheel built from this clone, installed with pip into a fresh virtual
environment outside the clone, used from another folder as a new user would: `check`,
`demo` (offline, its own Prefect API, a new Prefect home), then `server` and `queue`; and
`pipx install` and `uv tool install` of the clone, each then running `check` and `demo`.

pip's cache keeps the reinstall of labrun's dependencies cheap; nothing is downloaded when
they are cached (CI has them from its own install).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from e2e_helpers import REPO, UUID_RE
from support import on_prefect_home

NOISE = ("Traceback", "ERROR", "WARNING")


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_", "LABRUN_", "VIRTUAL_ENV", "PYTHON"))}
    env["PREFECT_HOME"] = str(home)
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """`labrun` of a fresh venv, with the wheel of this clone installed by pip."""
    root = tmp_path_factory.mktemp("install")
    wheels = root / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels),
                    str(REPO)], check=True, cwd=root, capture_output=True)
    wheel = next(wheels.glob("labrun-*.whl"))
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=True)
    pip = subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile", str(wheel)],
                         cwd=root, capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr[-3000:]
    return env_dir / "bin" / "labrun"


def test_the_wheel_carries_its_data_and_no_generic_module(installed):
    site = next((installed.parents[1] / "lib").glob("python3*/site-packages"))
    assert not (site / "flows").exists() and not (site / "phases").exists()
    assert not (site / "templates").exists() and not (site / "examples").exists()
    pkg = site / "labrun"
    for data in ("templates/STATE.md.j2", "examples/demo_noise_averaging.yaml", "prefect.yaml",
                 "flows/session.py", "phases/phase.py"):
        assert (pkg / data).is_file(), data


def test_an_installed_labrun_checks_and_runs_the_demo_offline(installed, tmp_path):
    example = next((installed.parents[1] / "lib").glob("python3*/site-packages/labrun/examples"))
    assert_checks_and_runs_the_demo(installed, example / "ml_label_smoothing_calibration.yaml", tmp_path)


@pytest.mark.parametrize("installer", ["pipx", "uv"])
def test_pipx_and_uv_install_a_labrun_that_checks_and_runs_the_demo(installer, tmp_path):
    """`pipx install CLONE` and `uv tool install CLONE`, from another folder, each building the
    wheel itself into a tool environment of its own (here under tmp_path)."""
    root = tmp_path / installer
    root.mkdir()
    env = _clean_env(tmp_path / "prefect-home")
    if installer == "pipx":
        env.update({"PIPX_HOME": str(root / "home"), "PIPX_BIN_DIR": str(root / "bin"),
                    "PIPX_MAN_DIR": str(root / "man")})
        cmd = [sys.executable, "-m", "pipx", "install", "--python", sys.executable, str(REPO)]
    else:
        env.update({"UV_TOOL_DIR": str(root / "tools"), "UV_TOOL_BIN_DIR": str(root / "bin"),
                    "UV_PYTHON_DOWNLOADS": "never"})
        cmd = [sys.executable, "-m", "uv", "tool", "install", "--python", sys.executable, str(REPO)]
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert_checks_and_runs_the_demo(root / "bin" / "labrun", REPO / "examples" / "ml_label_smoothing_calibration.yaml",
                                    tmp_path)


def assert_checks_and_runs_the_demo(installed: Path, idea: Path, tmp_path: Path) -> None:
    """From a folder of its own, with a new Prefect home (a first run: no database yet):
    `labrun check IDEA` passes, and `labrun demo` finishes offline, printing no noise."""
    env = _clean_env(tmp_path / "prefect-home")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    check = subprocess.run([str(installed), "check", str(idea)], cwd=elsewhere, env=env, capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0 and ": valid ·" in check.stdout, check.stderr
    # The bundled examples, copied out of site-packages, check where they land.
    copied = subprocess.run([str(installed), "examples", "ideas"], cwd=elsewhere, env=env, capture_output=True,
                            text=True, timeout=60)
    assert copied.returncode == 0, copied.stderr
    check = subprocess.run([str(installed), "check", "ideas/demo_noise_averaging.yaml"], cwd=elsewhere, env=env,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and ": valid ·" in check.stdout, check.stderr
    demo = subprocess.run([str(installed), "demo"], cwd=elsewhere, env=env, capture_output=True,
                          text=True, timeout=300)
    out = demo.stdout + demo.stderr
    assert demo.returncode == 0, out
    assert "Session complete ·" in out
    assert "Prefect builds its database" in " ".join(out.split()), out  # a first run says why it waits
    assert not [line for line in out.splitlines() if any(n in line for n in NOISE)], out
    assert on_prefect_home(tmp_path / "prefect-home") == []  # its API went with it
    report = (elsewhere / "labrun-demo" / "REPORT.md").read_text()
    assert report.startswith("# Report: Averaging noisy measurements")
    assert "The results above are those of attempt 2." in report
    version = subprocess.run([str(installed), "--version"], env=env, capture_output=True, text=True)
    assert version.stdout.strip() == "labrun 0.1.0"


def test_an_installed_labrun_serves_and_queues(installed, tmp_path):
    from labrun.prefect_processes import free_port, healthy

    env = _clean_env(tmp_path / "prefect-home")
    env["PREFECT_WORKER_QUERY_SECONDS"] = "1"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    log = tmp_path / "server.out"
    with open(log, "w") as out:
        server = subprocess.Popen([str(installed), "server", "--port", str(port)], cwd=elsewhere, env=env,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while "labrun server ready" not in log.read_text():
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        example = next((installed.parents[1] / "lib").glob("python3*/site-packages/labrun/examples"))
        # No PREFECT_API_URL: `labrun queue` finds the server that `labrun server` started.
        queued = subprocess.run([str(installed), "queue", str(example / "demo_noise_averaging.yaml"),
                                 "--workspaces", "ws", "--agent", "scripted"], cwd=elsewhere, env=env, capture_output=True,
                                text=True, timeout=120)
        assert queued.returncode == 0, queued.stderr
        assert UUID_RE.search(queued.stdout)
        workspace = Path(queued.stdout.split(" → ")[1].splitlines()[0])
        deadline = time.monotonic() + 180
        while True:
            status = subprocess.run([str(installed), "status", str(workspace), "--json"], env=env,
                                    capture_output=True, text=True, timeout=60)
            if status.returncode == 0 and json.loads(status.stdout)["session"]["complete"]:
                break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(2)
        worker_log = (tmp_path / "prefect-home" / "labrun" / "worker.log").read_text()
        # The demo's first attempt fails on purpose: its task run Failed, which Prefect logs as
        # an ERROR (with a "NoneType: None" for the exception it does not have). Nothing else may.
        expected = ("Task run 'attempt 1'", "NoneType: None")
        wrong = [line for line in worker_log.splitlines()
                 if ("Traceback" in line or "ERROR" in line or "NoneType" in line) and not any(e in line for e in expected)]
        assert not wrong, worker_log
    finally:
        os.killpg(server.pid, signal.SIGINT)  # Ctrl-C in its terminal
        code = server.wait(60)
    assert code == 0, log.read_text()
    assert not healthy(api_url)
