"""The workspace by content, for an experiment attempt on a machine that cannot see it
(`--experiments-storage`: docs/server-mode.md, "Experiments on other machines").

A store both sides reach, at any fsspec URL (a path on shared storage, `file://…`, `s3://…`):

    blobs/<sha256>                    a file's bytes, named by their digest: each sent once, ever
    attempts/<session>/<n>/in.json    what attempt n starts from (a `Manifest`)
    attempts/<session>/<n>/out.json   what it changed, and its records (written last)

- The engine (`send`) puts there the files the attempt starts from (its snapshot, `before`),
  only those the store lacks, read through `labrun.wsfs` (no link followed), and the engine's
  files the attempt's task reads (`ENGINE_IN`). A link is not sent, except one to shared data
  the idea declares (a dataset whose `source` is an absolute path): that one is sent as a
  reference, and the worker must see the same path. Environments (`.venv/`, …) and caches
  are not sent: the worker has its own.
- The worker (`materialize`) makes a fresh workspace of its own and writes the manifest's files
  beneath it through `labrun.wsfs`; every path is checked first (`check`): relative, no `..`,
  not the engine's folder, no link made but a declared reference. After the attempt's task ran
  there (`send_back`) it sends the files the attempt changed and its records (`ENGINE_OUT`),
  then out.json.
- The engine (`receive`), once the attempt's flow run is final, writes them into the
  workspace through `labrun.wsfs` (beneath it, never through a link), the attempt's run file
  last: from then on the attempt reads as if it had run here.

A blob is checked against its digest whenever it is read, so a store that lost or mangled one
fails the transfer instead of handing over wrong bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import secrets
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Callable, Iterator, cast

from pydantic import BaseModel, Field, ValidationError

from labrun.secrets import redact_bytes
from labrun.workspace import DATA, Workspace
from labrun.wsfs import Beneath, Refused

DIGEST = re.compile(r"^[0-9a-f]{64}$")
CHUNK = 1 << 20


class StorageError(ValueError):
    """Experiments storage that cannot be used: one line naming it and why."""


class TransferRefused(Refused):
    """A manifest naming a path that no transfer may write: one line naming it."""


def engine_in(n: int) -> list[str]:
    """The engine's files attempt n's task reads (`Session.attach`, `experiment_attempt`)."""
    return [f"{DATA}/state.json", f"{DATA}/idea.yaml", *(f"{DATA}/attempts/attempt-{n:03d}.{k}.json" for k in ("files", "run"))]


def engine_out(n: int) -> list[str]:
    """The records attempt n's task writes: its log, its command's report, what it wrote, and
    its run file (its record), which `receive` writes last."""
    return [f"{DATA}/attempts/attempt-{n:03d}.log",
            *(f"{DATA}/attempts/attempt-{n:03d}.{k}.json" for k in ("supervisor", "files", "run"))]


class Entry(BaseModel):
    sha256: str = Field(pattern=DIGEST.pattern)
    size: int = Field(ge=0)
    executable: bool = False


class Manifest(BaseModel):
    files: dict[str, Entry] = Field(default_factory=dict)
    """The agent's files, by path relative to the workspace."""
    engine: dict[str, Entry] = Field(default_factory=dict)
    """The engine's files (`engine_in`, `engine_out`)."""
    links: dict[str, str] = Field(default_factory=dict)
    """References to shared data the idea declares: path → the absolute path it names."""
    removed: list[str] = Field(default_factory=list)
    """(out.json) Files of in.json's that the attempt removed."""


# -- the store ------------------------------------------------------------------------------


class Store:
    """The blobs and manifests at `url`; `sent` and `received` count the bytes of blobs that
    really travelled (a blob the store had already is not sent)."""

    def __init__(self, url: str):
        import fsspec

        self.url = url
        try:
            self.fs, root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as e:  # an unknown protocol, or its package missing
            raise StorageError(f"experiments storage {url}: {e}") from None
        self.root = root.rstrip("/")
        self.sent = 0
        self.received = 0

    def _path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def has(self, digest: str) -> bool:
        return bool(self.fs.exists(self._path("blobs", digest)))

    def put(self, source: BinaryIO) -> tuple[str, int]:
        """The bytes of `source` as a blob; its digest and size. Streamed to a name of its own
        while hashed, then renamed to its digest (or dropped, when the store had it)."""
        temp = self._path("tmp", secrets.token_hex(8))
        self.fs.makedirs(self._path("tmp"), exist_ok=True)
        h, size = hashlib.sha256(), 0
        try:
            with self.fs.open(temp, "wb") as out:
                for chunk in iter(lambda: source.read(CHUNK), b""):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
            digest = h.hexdigest()
            if self.has(digest):
                self.fs.rm(temp)
            else:
                self.fs.makedirs(self._path("blobs"), exist_ok=True)
                self.fs.mv(temp, self._path("blobs", digest))
                self.sent += size
        except BaseException:
            if self.fs.exists(temp):
                self.fs.rm(temp)
            raise
        return digest, size

    @contextmanager
    def get(self, digest: str) -> Iterator[_Checked]:
        """The blob, read as a stream whose end checks its digest (`_Checked`)."""
        try:
            f = self.fs.open(self._path("blobs", digest), "rb")
        except FileNotFoundError:
            raise StorageError(f"experiments storage {self.url}: blob {digest} is missing") from None
        with f:
            yield _Checked(f, digest, self)

    def manifest_path(self, session_id: str, n: int, which: str) -> str:
        return self._path("attempts", _name(session_id), str(n), f"{which}.json")

    def write_manifest(self, session_id: str, n: int, which: str, manifest: Manifest) -> None:
        path = self.manifest_path(session_id, n, which)
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        temp = f"{path}.{secrets.token_hex(4)}.tmp"  # out.json says the attempt's records are all there: whole or absent
        with self.fs.open(temp, "w") as f:
            f.write(manifest.model_dump_json(indent=1))
        self.fs.mv(temp, path)

    def read_manifest(self, session_id: str, n: int, which: str) -> Manifest | None:
        """None when there is none; `TransferRefused` for one that does not parse."""
        path = self.manifest_path(session_id, n, which)
        try:
            with self.fs.open(path, "r") as f:
                text = f.read()
        except FileNotFoundError:
            return None
        try:
            return Manifest.model_validate_json(text)
        except ValidationError as e:
            raise TransferRefused(f"{self.url} {path}: not a transfer manifest ({e.errors()[0]['msg']})") from None

    def check(self, side: str) -> None:
        """`StorageError`, in one line, unless `side` can write, read back and remove a file here."""
        probe = self._path("probes", f"{side.replace(' ', '-')}-{secrets.token_hex(6)}")
        try:
            self.fs.makedirs(self._path("probes"), exist_ok=True)
            with self.fs.open(probe, "wb") as f:
                f.write(b"labrun")
            with self.fs.open(probe, "rb") as f:
                if f.read() != b"labrun":
                    raise OSError("what was written reads back different")
            self.fs.rm(probe)
        except Exception as e:  # whatever the protocol's package raises: said in one line
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise StorageError(f"experiments storage {self.url} cannot be used from {side}: {why}") from None


class _Checked:
    """A blob's stream that counts what it read and, at its end, refuses bytes that are not
    the digest's."""

    def __init__(self, f: BinaryIO, digest: str, store: Store):
        self.f, self.digest, self.store, self.h = f, digest, store, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        chunk = self.f.read(size)
        self.h.update(chunk)
        self.store.received += len(chunk)
        if not chunk or size < 0:
            self.verify()
        return chunk

    def verify(self) -> None:
        if self.h.hexdigest() != self.digest:
            raise StorageError(f"experiments storage {self.store.url}: blob {self.digest} does not hold what its "
                               "name says (changed or damaged in storage)")


def check_storage(url: str, workspace: str | None = None) -> None:
    """Refuses (`StorageError`, one line) storage the engine cannot use, a relative path (each
    side would find its own), and a folder in or above the workspace (`workspace`), where the
    agent's commands could write what comes back as an attempt's record; the worker's side is
    checked as its flow run starts (`run_from_storage`)."""
    store = Store(url)
    if store.fs.protocol in ("file", "local") or "file" in (store.fs.protocol or ()):
        if not (url.startswith("file://") or Path(url).is_absolute()):
            raise StorageError(f"experiments storage {url}: give an absolute path (each machine would read a "
                               "relative one from its own folder)")
        where, ws = Path(store.root).resolve(), Path(workspace).resolve() if workspace else None
        if ws is not None and (where == ws or ws in where.parents or where in ws.parents):
            raise StorageError(f"experiments storage {url}: it lies in or above the workspace {ws}, where the "
                               "agent's commands write; give a folder outside it")
    store.check("the engine's machine")


def _name(session_id: str) -> str:
    if not re.fullmatch(r"[\w-]{1,64}", session_id):
        raise TransferRefused(f"{session_id!r}: not a session id")
    return session_id


# -- the paths a manifest may name ----------------------------------------------------------


def agent_file(rel: str) -> str:
    """`rel`, a path of the agent's files in a manifest, or `TransferRefused` (one line): it
    must be relative, go nowhere up, name a file and stay out of the engine's folder."""
    path = PurePosixPath(rel)
    parts = path.parts
    if not rel or not rel.isprintable() or path.is_absolute() or "\\" in rel:
        raise TransferRefused(f"{rel!r}: not a relative path; a transfer writes only beneath the workspace")
    if any(p in ("", ".", "..") for p in rel.split("/")):
        raise TransferRefused(f"{rel}: names '..', '.' or an empty part; a transfer writes only beneath the workspace")
    if parts[0] == DATA or rel == "STATE.md":
        raise TransferRefused(f"{rel}: the engine's own; the agent's files never travel as it")
    return rel


def check(manifest: Manifest, n: int, which: str, declared: list[str] | None) -> None:
    """Every path of `manifest` (attempt n's `in` or `out`) one the transfer may write: the
    agent's files by `agent_file`, the engine's only by their names (`engine_in`,
    `engine_out`), a link only to shared data the idea declares (`declared`; None: the
    links' targets are checked later, once the idea is known)."""
    for rel in [*manifest.files, *manifest.links, *manifest.removed]:
        agent_file(rel)
    allowed = engine_in(n) if which == "in" else engine_out(n)
    for rel in manifest.engine:
        if rel not in allowed:
            raise TransferRefused(f"{rel}: not one of attempt {n}'s records; a transfer writes no other engine file")
    for rel, target in manifest.links.items():
        if declared is not None and not shared(target, declared):
            raise TransferRefused(f"{rel} -> {target}: a link to what the idea declares as shared data only")


def declared_data(idea) -> list[str]:
    """The shared data the idea declares: its datasets' sources that are absolute paths
    (`/data/…`, `file:///data/…`), which both machines see."""
    found = []
    for d in (idea.background.datasets or []) if idea.background else []:
        source = d.source.removeprefix("file://")
        if source.startswith("/") and os.path.normpath(source) == source.rstrip("/"):
            found.append(source.rstrip("/"))
    return found


def shared(target: str, declared: list[str]) -> bool:
    """`target` (a link's text, never followed) an absolute, normal path within `declared`."""
    return target.startswith("/") and os.path.normpath(target) == target and any(
        target == d or target.startswith(d + "/") for d in declared)


# -- the engine's side ------------------------------------------------------------------------


def send(ws: Workspace, store: Store, session_id: str, n: int, declared: list[str]) -> Manifest:
    """Attempt n's in.json: the files it starts from (its snapshot in `attempt-NNN.files.json`)
    and the engine's files its task reads, each blob sent unless the store has it."""
    before = json.loads(ws.files.read_text(ws.attempt_file(n, "files")))["before"]
    manifest = Manifest()
    for rel, digest in sorted(before.items()):
        if rel.endswith("/"):  # an environment: the worker has its own
            continue
        try:
            manifest.files[agent_file(rel)] = _send_file(ws.files, rel, store, digest)
        except (OSError, Refused):  # gone or swapped since the snapshot: not part of what it starts from
            continue
    for rel in engine_in(n):
        try:
            manifest.engine[rel] = _send_file(ws.files, rel, store)
        except FileNotFoundError:  # its run file, before it waited for anything
            continue
    if declared:
        for rel, st in ws.files.files(links=True):
            if stat.S_ISLNK(st.st_mode) and rel.split("/")[0] != DATA and shared(target := ws.files.readlink(rel),
                                                                                  declared):
                manifest.links[rel] = target
    check(manifest, n, "in", declared)
    store.write_manifest(session_id, n, "in", manifest)
    return manifest


def _send_file(files: Beneath, rel: str, store: Store, digest: str | None = None) -> Entry:
    """`rel`'s entry, its blob sent unless the store has it. `digest`: the file's in a snapshot
    just taken (`labrun.snapshot`), so that a file the store has is not read again; a `stat:`
    digest (a big file's) is no sha256: such a file is read here, and sent only if missing."""
    fd = files.open_file(rel)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        executable = bool(st.st_mode & stat.S_IXUSR)
        if digest is None or not DIGEST.match(digest):
            digest = _digest_of(f)
            f.seek(0)
        if store.has(digest):
            return Entry(sha256=digest, size=st.st_size, executable=executable)
        digest, size = store.put(f)  # its digest as sent: the file may have changed meanwhile
    return Entry(sha256=digest, size=size, executable=executable)


def _sparse(files: Beneath, rel: str) -> bool:
    """A file over 64 MB of which most is holes: what `truncate` makes at no cost, which
    would cost its whole size in the store and on the engine's disk."""
    st = files.lstat(rel)
    return st is not None and st.st_size > 64 << 20 and st.st_blocks * 512 < st.st_size // 2


REDACT_MAX = 16 << 20
"""The largest file the worker reads whole to take its keys out before it sends it back."""


def _send_redacted(files: Beneath, rel: str, store: Store) -> Entry | None:
    """`rel` sent with this worker's keys taken out, as the engine would take out its own
    (`labrun.secrets.redact_bytes`): the engine never knew keys that only the worker has. None
    when it holds none of them, or is too big to read whole (then sent as it is)."""
    st = files.lstat(rel)
    if st is None or st.st_size > REDACT_MAX:
        return None
    data = files.read_bytes(rel, REDACT_MAX)
    clean = redact_bytes(data)
    if clean == data:
        return None
    digest, size = store.put(io.BytesIO(clean))
    return Entry(sha256=digest, size=size, executable=bool(st.st_mode & stat.S_IXUSR))


def _digest_of(f: BinaryIO) -> str:
    h = hashlib.sha256()
    for chunk in iter(lambda: f.read(CHUNK), b""):
        h.update(chunk)
    return h.hexdigest()


def receive(ws: Workspace, store: Store, session_id: str, n: int, declared: list[str]) -> Manifest | None:
    """Attempt n's out.json into the workspace, the run file last; None when there is none
    (its flow run ended before the attempt's records were sent: nothing is written). A file
    that cannot be written beneath the workspace (a link the agent put on its way meanwhile)
    is left out, saying so."""
    from labrun.snapshot import entry_digest

    out = store.read_manifest(session_id, n, "out")
    if out is None:
        return None
    check(out, n, "out", declared)
    # Removals first, the deepest first: a folder the attempt made a file of (or a file it made
    # a folder of) is out of the way before what replaced it is written.
    for rel in sorted(out.removed, key=lambda r: r.count("/"), reverse=True):
        try:
            ws.files.remove(rel)
        except (OSError, Refused):
            pass
    came = set()
    for rel, entry in out.files.items():
        try:
            _write(ws.files, rel, entry, store)
            came.add(rel)
        except (OSError, Refused) as e:  # the agent's doing (a link put on its way): that file alone
            logging.getLogger("labrun").warning("attempt %d's %s was not brought back: %s", n, rel, e)
    log, report, files_json, run = engine_out(n)
    for rel in (log, report):
        if rel in out.engine:
            _write(ws.files, rel, out.engine[rel], store)
    if files_json in out.engine:  # the snapshot it started from stays the engine's; what it wrote is read here
        wrote = _json(store, out.engine[files_json]).get("wrote")
        if wrote is not None:  # only what came back (or went) is its own: any other file here is the engine's side's
            wrote = [rel for rel in wrote if rel in came or rel in out.removed or rel.endswith("/")]
        _update_json(ws, ws.attempt_file(n, "files"), {"wrote": wrote} if wrote is None else {
            "wrote": wrote, "after": {rel: d for rel in wrote if (d := entry_digest(ws.root, rel)) is not None}})
    if run in out.engine:  # last: with its record there, the attempt has ended here (its flow run's id kept)
        _update_json(ws, ws.attempt_file(n, "run"), _json(store, out.engine[run]))
    return out


def _json(store: Store, entry: Entry) -> dict[str, Any]:
    with store.get(entry.sha256) as f:
        found = json.loads(f.read())
    if not isinstance(found, dict):
        raise TransferRefused(f"blob {entry.sha256}: not one of an attempt's records")
    return found


def _update_json(ws: Workspace, path: Path, fields: dict[str, Any]) -> None:
    try:
        mine = json.loads(ws.files.read_text(path))
    except (OSError, ValueError):
        mine = {}
    ws.write_json(path, {**mine, **fields})


def _write(files: Beneath, rel: str, entry: Entry, store: Store) -> None:
    with store.get(entry.sha256) as f:
        files.write(rel, cast(BinaryIO, f), mode=0o755 if entry.executable else 0o644, before_rename=f.verify)


# -- the worker's side ------------------------------------------------------------------------


def run_from_storage(spec, run: Callable[[Any], dict], workdir: str | None = None) -> dict:
    """Attempt `spec.n` in a workspace of its own made here from the store (`spec.storage`):
    its record, once its outputs and records are in the store. The store is checked first;
    the workspace is removed at the end."""
    store = Store(spec.storage)
    store.check("the worker's machine")
    root = Path(tempfile.mkdtemp(prefix=f"labrun-attempt-{spec.n}-", dir=workdir or None))
    try:
        started = materialize(store, spec.session_id, spec.n, root)
        record = run(spec.model_copy(update={"workspace": str(root)}))
        send_back(store, spec.session_id, spec.n, root, started)
        logging.getLogger("labrun").info("attempt %d: %d bytes received, %d sent (%s)",
                                         spec.n, store.received, store.sent, store.url)
        return record
    finally:
        shutil.rmtree(root, ignore_errors=True)  # fd-based: no link in it is followed


def materialize(store: Store, session_id: str, n: int, root: Path) -> dict[str, str]:
    """Attempt n's in.json written beneath `root`, a new empty folder; the workspace's
    snapshot as built (`workspace_files`), its copies kept for the evidence (`keep_copies`)."""
    from labrun.idea import load_idea
    from labrun.snapshot import keep_copies, workspace_files

    manifest = store.read_manifest(session_id, n, "in")
    if manifest is None:
        raise StorageError(f"experiments storage {store.url}: no files for attempt {n} of session {session_id}")
    check(manifest, n, "in", None)  # the links' targets wait for the idea, which comes with it
    files = Beneath(root)
    for rel, entry in [*manifest.engine.items(), *manifest.files.items()]:
        _write(files, rel, entry, store)
    ws = Workspace(root)
    declared = declared_data(load_idea(ws.idea_copy))
    check(manifest, n, "in", declared)
    for rel, target in manifest.links.items():
        parent = files.mkdirs(str(PurePosixPath(rel).parent))
        try:
            os.symlink(target, PurePosixPath(rel).name, dir_fd=parent)
        finally:
            os.close(parent)
    started = workspace_files(root)
    keep_copies(root, started, ws.kept)
    # What it wrote is what changed from this workspace as built, here.
    record = json.loads(files.read_text(ws.attempt_file(n, "files")))
    ws.write_json(ws.attempt_file(n, "files"), {**record, "before": started})
    return started


def send_back(store: Store, session_id: str, n: int, root: Path, started: dict[str, str]) -> Manifest:
    """What attempt n changed beneath `root` (files it wrote or removed, read through
    `labrun.wsfs`) and its records, to the store; out.json last."""
    from labrun.snapshot import changed, workspace_files

    files = Beneath(root)
    now = workspace_files(root)
    out = Manifest()
    for rel in sorted(changed(started, now)):
        if rel.endswith("/"):  # an environment it made or changed: not carried
            continue
        if rel not in now:
            out.removed.append(agent_file(rel))
            continue
        if _sparse(files, rel):
            logging.getLogger("labrun").warning("attempt %d's %s is not sent back: a sparse file, mostly holes, "
                                                "would fill the store and the engine's disk", n, rel)
            continue
        try:
            out.files[agent_file(rel)] = _send_redacted(files, rel, store) or _send_file(files, rel, store, now[rel])
        except (OSError, Refused):
            continue
    for rel in engine_out(n):
        try:
            out.engine[rel] = _send_file(files, rel, store)
        except FileNotFoundError:  # no command ran (it was stopped before it started): no log
            continue
    store.write_manifest(session_id, n, "out", out)
    return out
