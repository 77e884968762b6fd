"""Bytes an attempt on another machine sends, against the workspace's size.

An attempt on a work pool whose worker cannot see the workspace gets its files through
experiments storage (`labrun.transfer`): the engine sends the files the attempt starts from,
by sha256, only those the storage lacks; the worker sends back what the attempt wrote. This
bench builds a workspace (many small source files and one large data file), then runs three
attempts' worth of transfer through a local store, side by side with what copying the whole
workspace each time would send:

1. the first attempt: the store is empty;
2. after the agent changed one source file;
3. after nothing changed (a rerun with another seed).

Each row also counts what the worker sends back (one results file the attempt wrote). No
Prefect, no model: the transfer functions the executor and the attempt flow call, on real files.

    python bench/transfer.py [--files 2000] [--data-mb 64]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from labrun.cli.running import DEMO_IDEA
from labrun.snapshot import workspace_files
from labrun.transfer import Store, materialize, send, send_back
from labrun.workspace import Workspace

SESSION = "bench0000000"


def build(root: Path, files: int, data_mb: int) -> int:
    (root / "src").mkdir(parents=True)
    for i in range(files):
        (root / "src" / f"module_{i:05d}.py").write_text(f"VALUE = {i}\n" + "# padding\n" * 100)
    (root / "data").mkdir()
    with open(root / "data" / "train.bin", "wb") as f:
        f.write(os.urandom(data_mb << 20))
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def stored_bytes(store_root: Path) -> int:
    return sum(p.stat().st_size for p in (store_root / "blobs").rglob("*") if p.is_file()) \
        if (store_root / "blobs").exists() else 0


def attempt(ws: Workspace, store: Store, store_root: Path, n: int, work: Path) -> tuple[int, int]:
    """Attempt n's files sent, then its outputs sent back: the bytes each way."""
    ws.attempts.mkdir(parents=True, exist_ok=True)
    ws.write_json(ws.attempt_file(n, "files"), {"before": workspace_files(ws.root), "wrote": None})
    ws.write_json(ws.attempt_file(n, "run"), {})
    before = stored_bytes(store_root)
    send(ws, store, SESSION, n, [])
    sent = stored_bytes(store_root) - before
    remote = work / f"attempt-{n}"
    remote.mkdir(parents=True)
    started = materialize(store, SESSION, n, remote)
    (remote / "results").mkdir(exist_ok=True)
    (remote / "results" / f"metrics-{n}.json").write_text(json.dumps({"seed": n, "loss": 1.0 / n}))
    before = stored_bytes(store_root)
    send_back(store, SESSION, n, remote, started)
    return sent, stored_bytes(store_root) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=2000, help="small source files in the workspace")
    parser.add_argument("--data-mb", type=int, default=64, help="size of its one data file, in MB")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root, store_root, work = Path(tmp, "ws"), Path(tmp, "store"), Path(tmp, "worker")
        size = build(root, args.files, args.data_mb)
        ws, store = Workspace(root), Store(str(store_root))
        ws.data.mkdir()
        shutil.copyfile(DEMO_IDEA, ws.idea_copy)  # the attempt's task reads the session's idea
        rows = [("first attempt (empty store)", *attempt(ws, store, store_root, 1, work))]
        (root / "src" / "module_00000.py").write_text("VALUE = -1\n")
        rows.append(("one source file changed", *attempt(ws, store, store_root, 2, work)))
        rows.append(("nothing changed", *attempt(ws, store, store_root, 3, work)))
    table = Table(title=f"Bytes per attempt on another machine (workspace {size / 1e6:.1f} MB, "
                        f"{args.files + 1} files)")
    for column in ("attempt", "sent", "sent / workspace", "copying it all", "sent back"):
        table.add_column(column, justify="left" if column == "attempt" else "right")
    for name, sent, back in rows:
        table.add_row(name, f"{sent:,}", f"{sent / size:.4f}", f"{size:,}", f"{back:,}")
    Console().print(table)


if __name__ == "__main__":
    main()
