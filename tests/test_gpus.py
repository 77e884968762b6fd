"""GPUs shared out to experiment attempts (labrun/gpus.py) and bound into their sandbox.

This machine has no GPU: the GPUs are the ones labrun is told of, `CUDA_VISIBLE_DEVICES=0,1`
in its environment, and a stand-in `nvidia-smi` (a shell script on PATH) and stand-in driver
files (/proc/driver/nvidia/gpus) where a test needs what only those tools tell. The locks are
real: lock files and `flock` in a folder of the test's, held by real child processes."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from support import wait_for
from labrun import gpus, sandbox
from labrun.gpus import Gpu, GpuRefused, GpuWaitCancelled, claim, devices

needs_bwrap = pytest.mark.usefixtures("bubblewrap_works")
POLL = 0.05


@pytest.fixture
def locks(tmp_path: Path) -> Path:
    """A lock folder of this test's: another test run, or labrun itself, on this machine
    never shares it."""
    return tmp_path / "locks"


@pytest.fixture
def two_gpus(monkeypatch, tmp_path: Path) -> None:
    """labrun is given GPUs 0 and 1, and no nvidia-smi is found (PATH holds none)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    no_tools = tmp_path / "no-tools"
    no_tools.mkdir()
    monkeypatch.setenv("PATH", str(no_tools))
    monkeypatch.setattr(gpus, "NVIDIA_PROC", tmp_path / "no-driver")


def hold(fds: tuple[int, ...]) -> subprocess.Popen:
    """A child that inherits the claim's descriptors, as the attempt's supervisor does."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=fds)


class Waiter(threading.Thread):
    """`claim(count)` in a thread of its own: what it said while waiting, and what it got."""

    def __init__(self, count: int, locks: Path, cancelled: threading.Event | None = None):
        super().__init__(daemon=True)
        self.count, self.locks, self.cancelled = count, locks, cancelled
        self.said: list[str] = []
        self.got: gpus.Claim | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.got = claim(self.count, self.said.append, self.cancelled, folder=self.locks, poll_s=POLL)
        except BaseException as e:
            self.error = e


def test_claims_get_gpus_of_their_own_and_a_third_waits_until_a_holders_process_ends(two_gpus, locks):
    first, second = claim(1, folder=locks), claim(1, folder=locks)
    assert {*first.ids, *second.ids} == {"0", "1"}
    assert first.env() == {"CUDA_VISIBLE_DEVICES": first.ids[0]}
    holders = [hold(first.fds), hold(second.fds)]
    first.close()  # the engine's own copies: the children still hold the GPUs
    second.close()
    try:
        third = Waiter(1, locks)
        wait_for(lambda: third.said, timeout=10)
        assert third.said == ["waiting for 1 GPU (2 of 2 in use)"]
        time.sleep(10 * POLL)
        assert third.is_alive(), "a GPU was given out while its holder lived"
        holders[1].send_signal(signal.SIGKILL)  # however the holder ends, the kernel frees its GPU
        holders[1].wait()
        third.join(10)
        assert third.got is not None and third.got.ids == second.ids
        assert third.said == ["waiting for 1 GPU (2 of 2 in use)"], "on_wait is called once"
        third.got.close()
    finally:
        for p in holders:
            p.kill()
            p.wait()


def test_a_claim_waiting_for_more_holds_none_meanwhile(two_gpus, locks):
    """All or none: a claim of 2 that waits does not sit on the free GPU (two such claims,
    each holding one, would wait for each other for good)."""
    held = claim(1, folder=locks)
    both = Waiter(2, locks)
    wait_for(lambda: both.said, timeout=10)
    other = Waiter(1, locks)
    other.join(10)
    assert other.got is not None and other.got.ids != held.ids
    assert both.is_alive()
    held.close()
    other.got.close()
    both.join(10)
    assert both.got is not None and sorted(both.got.ids) == ["0", "1"]
    both.got.close()


def test_a_claim_of_more_gpus_than_labrun_is_given_is_refused_in_one_line(two_gpus, locks):
    for count, told in ((3, "asked for 3 GPUs; this machine gives labrun 2 GPUs (CUDA_VISIBLE_DEVICES=0,1)"),
                        (-1, "asked for -1 GPUs; this machine gives labrun 2 GPUs (CUDA_VISIBLE_DEVICES=0,1)")):
        with pytest.raises(GpuRefused) as refused:
            claim(count, folder=locks)
        assert str(refused.value) == told
    assert not locks.exists(), "a refused claim waits for nothing and takes nothing"


def test_a_claim_of_none_sees_no_gpu_where_there_are_some(two_gpus, monkeypatch, locks):
    none = claim(0, folder=locks)
    assert (none.ids, none.fds, none.minors) == ([], (), ())
    assert none.env() == {"CUDA_VISIBLE_DEVICES": ""}
    for nothing in ("", "-1", "NoDevFiles"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", nothing)
        assert devices() == []
        with pytest.raises(GpuRefused, match=rf"^asked for 1 GPU; this machine gives labrun no GPUs "
                                             rf"\(CUDA_VISIBLE_DEVICES={nothing}\)$"):
            claim(1, folder=locks)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert devices() == [], "no CUDA_VISIBLE_DEVICES and no nvidia-smi: no GPUs"
    with pytest.raises(GpuRefused, match=r"^asked for 2 GPUs; this machine gives labrun no GPUs "
                                         r"\(CUDA_VISIBLE_DEVICES unset: nvidia-smi's list\)$"):
        claim(2, folder=locks)
    assert claim(0, folder=locks).env() == {}, "nothing to hide on a machine without GPUs"


def test_a_gpu_named_twice_is_one_gpu(two_gpus, monkeypatch, locks):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0, 0,1")
    assert [g.id for g in devices()] == ["0", "1"]


def test_a_cancelled_wait_ends_in_one_clear_line(two_gpus, locks):
    held = claim(2, folder=locks)
    cancelled = threading.Event()
    waiter = Waiter(1, locks, cancelled)
    wait_for(lambda: waiter.said, timeout=10)
    cancelled.set()
    waiter.join(10)
    assert isinstance(waiter.error, GpuWaitCancelled)
    assert str(waiter.error) == "the wait for 1 GPU was cancelled"
    held.close()


# -- links and folders planted by someone else ---------------------------------------------------

def naive_lock(folder: Path, name: str) -> int:
    """How a lock file would be opened without care: through whatever lies at its path."""
    folder.mkdir(exist_ok=True)
    return os.open(folder / name, os.O_RDWR | os.O_CREAT, 0o600)


def test_a_link_planted_in_the_lock_folder_is_not_followed(two_gpus, locks, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    claim(1, folder=locks).close()  # labrun's folder, made as labrun makes it
    (locks / "0").unlink()
    (locks / "0").symlink_to(victim)
    fd = naive_lock(locks, "0")  # the attack works against a naive open: it writes through the link
    os.write(fd, b"x")
    os.close(fd)
    assert victim.read_text() == "xrecious\n"
    with pytest.raises(GpuRefused) as refused:
        claim(1, folder=locks)
    assert str(refused.value) == (f"{locks / '0'}: a link; labrun locks a GPU only with a file of its own "
                                  "(remove it and labrun makes it anew)")
    assert victim.read_text() == "xrecious\n" and (locks / "0").is_symlink()
    os.mkfifo(locks / "1")  # not a link, nor a lock file either
    (locks / "0").unlink()
    with pytest.raises(GpuRefused, match="/1: not a regular file; "):
        claim(2, folder=locks)


def test_a_lock_folder_that_is_a_link_or_open_to_others_is_refused(two_gpus, locks, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    locks.symlink_to(elsewhere)
    os.close(naive_lock(locks, "0"))  # a naive lock lands in the folder the link points to
    assert (elsewhere / "0").exists()
    (elsewhere / "0").unlink()
    with pytest.raises(GpuRefused) as refused:
        claim(1, folder=locks)
    assert str(refused.value) == (f"{locks}: a link; labrun keeps its GPU locks only in a folder of its own "
                                  "(remove it and labrun makes it anew)")
    assert list(elsewhere.iterdir()) == []
    locks.unlink()
    locks.mkdir(mode=0o755)
    os.chmod(locks, 0o777)  # whoever may write in it may plant what they like
    with pytest.raises(GpuRefused, match=r"owned by uid \d+ with mode drwxrwxrwx; labrun keeps its GPU locks only "
                                         r"in a folder of uid \d+'s alone"):
        claim(1, folder=locks)
    assert list(locks.iterdir()) == []


def test_a_lock_folder_of_another_user_is_refused(two_gpus, locks):
    if os.getuid() != 0:
        pytest.skip("making a folder another user owns needs root")
    locks.mkdir(mode=0o700)
    os.chown(locks, 4321, 4321)
    with pytest.raises(GpuRefused, match=r"owned by uid 4321 with mode drwx------; "):
        claim(1, folder=locks)
    assert list(locks.iterdir()) == []


def test_the_folder_is_made_for_this_user_alone(two_gpus, tmp_path, monkeypatch):
    monkeypatch.setattr(gpus.tempfile, "tempdir", str(tmp_path))
    claim(1).close()
    made = tmp_path / f"labrun-{os.getuid()}-gpus"
    assert stat.S_IMODE(made.stat().st_mode) == 0o700 and made.stat().st_uid == os.getuid()


# -- nvidia-smi and the driver's files -----------------------------------------------------------

NVIDIA_SMI = """#!/bin/sh
# A stand-in for NVIDIA's tool, on a machine without GPUs: it answers the one query labrun makes.
[ "$*" = "--query-gpu=index,uuid --format=csv,noheader" ] || exit 2
printf '0, GPU-aaaa-0000\\n1, GPU-bbbb-1111\\n'
"""
INFORMATION = "Model: \t\t NVIDIA H100\nGPU UUID: \t {uuid}\nBus Location: \t 0000:{bus}:00.0\nDevice Minor: \t {minor}\n"


@pytest.fixture
def nvidia(monkeypatch, tmp_path: Path) -> None:
    """A stand-in nvidia-smi on PATH and the driver's files saying minors 3 and 7 (a minor
    need not be an index)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "nvidia-smi").write_text(NVIDIA_SMI)
    (tools / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    proc = tmp_path / "proc"
    for bus, uuid, minor in (("18", "GPU-aaaa-0000", 3), ("2a", "GPU-bbbb-1111", 7)):
        (proc / f"0000:{bus}:00.0").mkdir(parents=True)
        (proc / f"0000:{bus}:00.0" / "information").write_text(INFORMATION.format(uuid=uuid, bus=bus, minor=minor))
    monkeypatch.setattr(gpus, "NVIDIA_PROC", proc)


def test_without_cuda_visible_devices_the_gpus_are_those_nvidia_smi_lists(nvidia, monkeypatch, locks):
    assert devices() == [Gpu("0", "GPU-aaaa-0000", 3), Gpu("1", "GPU-bbbb-1111", 7)]
    # labrun's own CUDA_VISIBLE_DEVICES narrows them, by index or by UUID
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert devices() == [Gpu("1", "GPU-bbbb-1111", 7)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb-1111")
    held = claim(1, folder=locks)
    assert (held.ids, held.minors) == (["GPU-bbbb-1111"], (7,))
    # One GPU, one lock, however a session names it
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    waiter = Waiter(1, locks)
    wait_for(lambda: waiter.said, timeout=10)
    held.close()
    waiter.join(10)
    assert waiter.got is not None and waiter.got.ids == ["1"]
    # The attempt is given its GPU by UUID: the same GPU however CUDA numbers what it sees.
    assert waiter.got.env() == {"CUDA_VISIBLE_DEVICES": "GPU-bbbb-1111"}
    waiter.got.close()


def test_an_nvidia_smi_that_fails_gives_no_gpus_and_says_why(nvidia, tmp_path, caplog):
    (tmp_path / "tools" / "nvidia-smi").write_text(
        "#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"\nexit 9\n")
    assert devices() == []
    assert "nvidia-smi did not list the GPUs (NVIDIA-SMI has failed because it couldn't communicate with the " \
           "NVIDIA driver.)" in caplog.text


# -- the sandbox binds the claim's GPUs ------------------------------------------------------------

@pytest.fixture
def dev(monkeypatch, tmp_path: Path) -> Path:
    """A stand-in /dev with three NVIDIA GPUs' nodes, the driver's shared ones, and AMD's."""
    root = tmp_path / "dev"
    root.mkdir()
    for name in ("nvidia0", "nvidia3", "nvidia7", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset",
                 "kfd", "null"):
        (root / name).touch()
    (root / "nvidia-caps").mkdir()
    (root / "dri").mkdir()
    monkeypatch.setattr(sandbox, "DEV", root)
    return root


SHARED = ["dri", "kfd", "nvidia-caps", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"]


def names(paths: list[str]) -> list[str]:
    return sorted(Path(p).name for p in paths)


def test_a_sandbox_binds_only_its_claims_gpus(dev):
    assert names(sandbox.gpu_nodes()) == sorted([*SHARED, "nvidia0", "nvidia3", "nvidia7"])
    assert names(sandbox.gpu_nodes((7,))) == sorted([*SHARED, "nvidia7"])
    assert names(sandbox.gpu_nodes(())) == sorted(SHARED)


@needs_bwrap
def test_the_sandboxs_command_line_binds_the_claimed_gpu_alone(dev, nvidia, locks, tmp_path):
    box = sandbox.Sandbox(tmp_path / "ws", tmp_path / "tmp")
    (tmp_path / "ws").mkdir()

    def bound(box: sandbox.Sandbox) -> list[str]:
        argv = box.wrap(["true"], 0)
        return names([argv[i + 1] for i, a in enumerate(argv) if a == "--dev-bind"])

    assert bound(box) == sorted([*SHARED, "nvidia0", "nvidia3", "nvidia7"]), "no claim: every GPU, as for `bash`"
    held = claim(1, folder=locks)
    assert bound(box.with_gpus(held)) == sorted([*SHARED, "nvidia3"])
    held.close()
    assert bound(box.with_gpus(claim(0, folder=locks))) == sorted(SHARED)
    unknown = gpus.Claim([Gpu("0")], (), True)  # no driver files: the minor is not known
    assert bound(box.with_gpus(unknown)) == sorted([*SHARED, "nvidia0", "nvidia3", "nvidia7"])
