"""The GPUs an experiment attempt gets: which this machine gives labrun (`devices`), and a set
of them held for one attempt alone (`claim`), without overlap between the attempts of one
session, of several sessions, or of the sessions a worker runs.

Which GPUs: those of `CUDA_VISIBLE_DEVICES` in labrun's own environment when it is set (a
scheduler's share of the machine, Slurm's included; empty, `-1` or `NoDevFiles`: none), else
every GPU `nvidia-smi` lists, else none. Where `nvidia-smi` and the driver's
/proc/driver/nvidia/gpus tell, each GPU's UUID and the minor number of its /dev/nvidia<minor>
are known too: an attempt is given its GPUs by UUID (`Claim.env`), which means the same GPU
however CUDA numbers what it sees (a sandbox that binds only some GPUs' nodes renumbers
them from 0), and its sandbox binds only their nodes (`labrun.sandbox.Sandbox.with_gpus`). An
index names the GPU `nvidia-smi` gives that index (PCI bus order, CUDA's own with
`CUDA_DEVICE_ORDER=PCI_BUS_ID` and on a machine of one model of GPU).

How they are held: one lock file per GPU in a folder of this user's under the machine's
temporary folder (`labrun-<uid>-gpus`), taken with `flock`. A claim's descriptors are handed
to the attempt's supervisor (`pass_fds`) and the engine closes its own: a flock belongs to
the open file, so the GPU stays held exactly as long as the supervisor lives, and the kernel
frees it when the supervisor ends, however it ends. Not a Prefect concurrency limit: its slot
is released when the engine's process ends or its lease runs out, but the attempt outlives
the engine (`labrun.supervisor`) and goes on using the GPU; and the GPUs are the machine's,
not the Prefect server's, which may serve several machines. Every engine of this user on this
machine (sessions, a worker's flow runs) sees the same folder, so none overlaps another.

The folder is made 0700 and used only if it is a real folder (not a link) of this user's
alone; a lock file is opened without following a link (`O_NOFOLLOW`) and used only if it is a
regular file: the engine never follows a path someone else could have planted.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

log = logging.getLogger("labrun")

NO_DEVICES = ("", "-1", "NoDevFiles")
"""`CUDA_VISIBLE_DEVICES` values that give no GPU (Slurm writes `NoDevFiles`)."""
NVIDIA_PROC = Path("/proc/driver/nvidia/gpus")
"""The driver's folder per GPU, whose `information` says its UUID and device minor."""
POLL_S = 1.0


class GpuRefused(ValueError):
    """A claim labrun will not make; the message is one line saying why."""


class GpuWaitCancelled(Exception):
    """The wait for free GPUs was cancelled (`claim`'s `cancelled`)."""


@dataclass(frozen=True)
class Gpu:
    id: str
    """As labrun was given it: an entry of `CUDA_VISIBLE_DEVICES`, or nvidia-smi's index."""
    uuid: str | None = None
    minor: int | None = None
    """N of its /dev/nvidiaN; None when unknown."""

    @property
    def cuda_id(self) -> str:
        """What names it in an attempt's `CUDA_VISIBLE_DEVICES`: the UUID where known."""
        return self.uuid or self.id

    @property
    def lock_name(self) -> str:
        """Its lock file's name: the same GPU has one lock whichever way a session names it."""
        return re.sub(r"[^A-Za-z0-9._-]", "_", self.uuid or self.id)


def devices() -> list[Gpu]:
    """The GPUs labrun may give out (module docstring)."""
    listed = _nvidia_smi()
    minors = _minors()
    by_name = {**{index: uuid for index, uuid in listed}, **{uuid: uuid for _, uuid in listed}}
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is None:
        ids = [index for index, _ in listed]
    elif given.strip() in NO_DEVICES:
        ids = []
    else:
        ids = [part.strip() for part in given.split(",") if part.strip()]
    gpus: dict[str, Gpu] = {}
    for gpu_id in ids:
        uuid = by_name.get(gpu_id)
        gpu = Gpu(gpu_id, uuid, minors.get(uuid) if uuid else None)
        # A GPU named twice ("0,0", or by its index and by its UUID) is one GPU, with one lock.
        gpus.setdefault(gpu.lock_name, gpu)
    return list(gpus.values())


def _where_from() -> str:
    """Where `devices` found them, for a message."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "CUDA_VISIBLE_DEVICES unset: nvidia-smi's list" if given is None else f"CUDA_VISIBLE_DEVICES={given}"


def _nvidia_smi() -> list[tuple[str, str]]:
    """(index, UUID) of each GPU nvidia-smi lists; none where it is missing or fails."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        if not isinstance(e, FileNotFoundError):
            log.warning("nvidia-smi did not list the GPUs (%s)", e)
        return []
    if out.returncode != 0:
        why = (out.stderr.strip() or out.stdout.strip() or f"exit code {out.returncode}").splitlines()[-1]
        log.warning("nvidia-smi did not list the GPUs (%s)", why)
        return []
    rows = []
    for line in out.stdout.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0].isdigit() and fields[1]:
            rows.append((fields[0], fields[1]))
    return rows


def _minors() -> dict[str, int]:
    """Each GPU's device minor by its UUID, as the driver's /proc files say."""
    minors = {}
    for info in sorted(NVIDIA_PROC.glob("*/information")):
        try:
            fields = dict(line.split(":", 1) for line in info.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        uuid, minor = fields.get("GPU UUID", "").strip(), fields.get("Device Minor", "").strip()
        if uuid and minor.isdigit():
            minors[uuid] = int(minor)
    return minors


def lock_folder() -> Path:
    return Path(tempfile.gettempdir(), f"labrun-{os.getuid()}-gpus")


def _open_folder(folder: Path) -> int:
    """The lock folder's descriptor: made 0700 if missing; refused unless it is a real folder
    of this user's that no one else may write."""
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        why = "a link" if folder.is_symlink() else "not a folder" if e.errno == errno.ENOTDIR else e.strerror
        raise GpuRefused(f"{folder}: {why}; labrun keeps its GPU locks only in a folder of its own "
                         "(remove it and labrun makes it anew)") from None
    st = os.fstat(fd)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        os.close(fd)
        raise GpuRefused(f"{folder}: owned by uid {st.st_uid} with mode {stat.filemode(st.st_mode)}; labrun keeps "
                         f"its GPU locks only in a folder of uid {os.getuid()}'s alone (remove it and labrun makes it anew)")
    return fd


def _open_lock(folder_fd: int, folder: Path, name: str) -> int:
    """The lock file `name`, made if missing, never through a link."""
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600,
                     dir_fd=folder_fd)
    except OSError as e:
        why = "a link" if e.errno == errno.ELOOP else e.strerror
        raise GpuRefused(f"{folder / name}: {why}; labrun locks a GPU only with a file of its own "
                         "(remove it and labrun makes it anew)") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise GpuRefused(f"{folder / name}: not a regular file; labrun locks a GPU only with a file of its own "
                         "(remove it and labrun makes it anew)")
    return fd


@dataclass
class Claim:
    """GPUs held for one attempt while `fds` are open (in this process or one they were
    passed to)."""
    gpus: list[Gpu]
    fds: tuple[int, ...]
    machine_has_gpus: bool

    @property
    def ids(self) -> list[str]:
        """The GPUs as labrun was given them: what the attempt's record says it had."""
        return [g.id for g in self.gpus]

    @property
    def minors(self) -> tuple[int, ...] | None:
        """The minors of the GPUs' /dev/nvidia nodes; None when any is unknown (then a
        sandbox binds all: the attempt still reaches its GPUs, `CUDA_VISIBLE_DEVICES` alone
        keeps it to them)."""
        if any(g.minor is None for g in self.gpus):
            return None
        return tuple(g.minor for g in self.gpus if g.minor is not None)

    def env(self) -> dict[str, str]:
        """The attempt's `CUDA_VISIBLE_DEVICES`: its GPUs, or none on a machine that has some
        (an attempt that asked for none sees none); nothing on a machine without GPUs."""
        if not self.gpus and not self.machine_has_gpus:
            return {}
        return {"CUDA_VISIBLE_DEVICES": ",".join(g.cuda_id for g in self.gpus)}

    def close(self) -> None:
        """Close this process's descriptors: the GPUs are free unless another process holds
        copies (the attempt's supervisor, which `pass_fds` gave them)."""
        fds, self.fds = self.fds, ()
        for fd in fds:
            os.close(fd)


def check(count: int) -> list[Gpu]:
    """The machine's GPUs, when it gives labrun `count` of them; else `GpuRefused`, one line."""
    gpus = devices()
    if count < 0 or count > len(gpus):
        have = f"{len(gpus)} GPU{'' if len(gpus) == 1 else 's'}" if gpus else "no GPUs"
        raise GpuRefused(f"asked for {count} GPU{'' if count == 1 else 's'}; this machine gives labrun {have} "
                         f"({_where_from()})")
    return gpus


class Cancel(Protocol):
    """What says a wait is cancelled, as `threading.Event.wait` does: True once it is."""

    def wait(self, timeout: float) -> bool: ...


def claim(count: int, on_wait: Callable[[str], None] | None = None, cancelled: Cancel | None = None,
          folder: Path | None = None, poll_s: float = POLL_S) -> Claim:
    """`count` GPUs of `devices()` held for one attempt, waiting (`poll_s` apart) until that
    many are free; `on_wait(text)` is called once if it has to wait. Refused (`GpuRefused`, one
    line) when the machine gives labrun fewer; `GpuWaitCancelled` once `cancelled` is set."""
    gpus = check(count)
    if count == 0:
        return Claim([], (), bool(gpus))
    folder = folder or lock_folder()
    folder_fd = _open_folder(folder)
    try:
        waited = False
        while True:
            taken = _take(folder_fd, folder, gpus, count)
            if len(taken) == count:
                return Claim([g for g, _ in taken], tuple(fd for _, fd in taken), True)
            # All or none: holding some while waiting for more would deadlock two claims.
            for _, fd in taken:
                os.close(fd)
            if not waited and on_wait is not None:
                on_wait(f"waiting for {count} GPU{'' if count == 1 else 's'} "
                        f"({len(gpus) - len(taken)} of {len(gpus)} in use)")
            waited = True
            if cancelled is None:
                time.sleep(poll_s)
            elif cancelled.wait(poll_s):
                raise GpuWaitCancelled(f"the wait for {count} GPU{'' if count == 1 else 's'} was cancelled")
    finally:
        os.close(folder_fd)


def _take(folder_fd: int, folder: Path, gpus: list[Gpu], count: int) -> list[tuple[Gpu, int]]:
    """Up to `count` of `gpus` locked now, each with its lock's descriptor."""
    taken: list[tuple[Gpu, int]] = []
    try:
        for gpu in gpus:
            if len(taken) == count:
                break
            fd = _open_lock(folder_fd, folder, gpu.lock_name)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            taken.append((gpu, fd))
    except BaseException:
        for _, fd in taken:
            os.close(fd)
        raise
    return taken
