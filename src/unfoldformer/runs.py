"""Run folders and the checks made before any work.

- `check_at_least`, `check_device`, `check_output_location`: settings checked before any data is
  read, each error naming the setting (an output location by creating and removing a probe file).
- `new_run_id`, `config_sha256`: what ties every file of a run to that run.
- `folder_lock`: an exclusive lock on an output folder for the life of a run (a lock file beside
  it, `.NAME.lock`, held with `flock`, so the kernel releases it when the process dies however it
  dies); a second run into the same folder fails at once, naming the holder's pid and command.
  A lock file whose process is gone is stale and taken over.
- `staged_output`: an output folder built in a temporary sibling (`.NAME.tmp-*`) and moved into
  place with `complete.json` (command, run id, config sha256, every file with its size and
  sha256) once every file is written: the folder is whole or absent, and never mixes two runs.
- `write_manifest` / `verify_manifest` / `manifest_vouches`: the same `complete.json` for folders
  written in place (training runs): written last, checked on every load (a file changed, missing
  or truncated since is an `IntegrityError` naming it); `refresh_manifest` re-pins a folder whose
  files its own command edited.
- `claim_run_folder`: a folder written in place (training) that holds another run is refused unless
  resumed or started over; starting over deletes that run's files, and refuses first, deleting
  nothing, when one of them is an input of the new run (`contracts.check_output_apart`).
- An output folder is never the working directory or one of its parents (an empty `--out ''`
  is the working directory: refused before any work, `check_output_folder`).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .contracts import check_at_least, check_device, check_output_apart, check_output_location, resolve_device
from .errors import ConfigError, OutputError
from .persist.manifest import (
    MANIFEST_NAME,
    config_sha256,
    folder_manifest,
    manifest_vouches,
    refresh_manifest,
    verify_manifest,
    write_manifest,
)
from .utils import current_umask, fsync_folder, write_json

__all__ = ["MANIFEST_NAME", "check_at_least", "check_device", "check_output_apart", "check_output_folder",
           "check_output_location", "claim_run_folder",
           "config_sha256", "folder_lock", "manifest_vouches", "new_run_id", "refresh_manifest", "resolve_device",
           "staged_output", "verify_manifest", "write_manifest"]


# ----------------------------------------------------------------------------- run identity and digests
def new_run_id() -> str:
    """A fresh run id: UTC start time plus 8 random hex digits (sortable, unique in practice)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


# ----------------------------------------------------------------------------- run folders
def _lock_path(folder: Path) -> Path:
    return folder.parent / f".{folder.name}.lock"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _describe_holder(text: str) -> str:
    try:
        h = json.loads(text)
        return f"pid {h['pid']} on {h['host']}, `unfoldformer {h['command']}`, since {h['started']}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"


@contextmanager
def folder_lock(folder: str | Path, command: str) -> Iterator[Path]:
    """Hold an exclusive lock on output folder `folder` for the block; yields its absolute path.

    The lock is the lock file `.NAME.lock` beside the folder, held with `flock`: the kernel releases
    it when the process ends in any way (SIGKILL included), and the file is removed on a normal exit.
    Another process that holds it makes this raise `OutputError` at once, naming its pid and command;
    a lock file left by a process that is gone is stale and is taken over (with a note on stderr)."""
    import fcntl

    folder = Path(folder).expanduser().resolve()
    folder.parent.mkdir(parents=True, exist_ok=True)
    path = _lock_path(folder)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace")
            os.close(fd)
            raise OutputError(f"{folder} is in use by another run ({_describe_holder(holder)}; lock {path}); "
                              "two runs in one folder would mix their files: wait for it or choose another "
                              "folder") from None
        try:                                                      # a releasing holder may have removed the file
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        stale = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        if stale.strip():
            pid = json.loads(stale).get("pid") if stale.lstrip().startswith("{") else None
            gone = "no longer running" if not isinstance(pid, int) or not _pid_alive(pid) else "lock released"
            print(f"note: took over the stale lock {path} ({_describe_holder(stale)}, {gone})", file=sys.stderr)
        me = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                         "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        os.ftruncate(fd, 0)
        os.pwrite(fd, me.encode(), 0)
        os.fsync(fd)
        yield folder
    finally:
        try:
            os.unlink(path)                                       # while still holding the lock
        except FileNotFoundError:
            pass
        os.close(fd)


def _replaceable(folder: Path, command: str, owned: Callable[[str], bool]) -> None:
    """OutputError unless `folder` is absent, empty, an earlier output of `command`, or holds only files it writes."""
    if not folder.exists():
        return
    if not folder.is_dir():
        raise OutputError(f"{folder}: exists and is a file, not a folder")
    names = [p.name for p in folder.iterdir()]
    try:
        earlier = json.loads((folder / MANIFEST_NAME).read_text()).get("command")
    except (OSError, ValueError, AttributeError):
        earlier = None
    if earlier == command or all(owned(n) for n in names):
        return
    foreign = sorted(n for n in names if not owned(n))[:5]
    raise OutputError(f"{folder}: holds files that `unfoldformer {command}` did not write ({', '.join(foreign)}); "
                      "it replaces its whole output folder, so choose a new or empty folder")


def check_output_folder(name: str, path: str | Path, command: str,
                        owned: Callable[[str], bool] = lambda name: False) -> Path:
    """Everything `staged_output` will check, checked now, before any work: `path` given, writable
    (`check_output_location`), not the working directory or one of its parents, and replaceable
    (absent, empty, an earlier output of `command`, or only names `owned` accepts)."""
    folder = check_output_location(name, path)
    here = Path.cwd().resolve()
    if folder == here or folder in here.parents:
        raise OutputError(f"{name} {folder}: is the working directory or one above it; the command replaces its "
                          "whole output folder, so give a new folder (e.g. --out results)")
    _replaceable(folder, command, owned)
    return folder


def claim_run_folder(out: str | Path, run_files: tuple[str, ...], *, resume: bool, overwrite: bool,
                     inputs: dict[str, Any] | None = None, whole: dict[str, Any] | None = None,
                     command: str = "train") -> None:
    """Refuse a folder holding another run (any of `run_files`, or a `tensorboard` folder) unless resuming it
    (`checkpoint.pt`) or starting over (`overwrite`). Starting over deletes that run's files, so no file of it
    stays beside the new run's; it refuses first, deleting nothing, when one of them is, holds or lies in one
    of the new run's `inputs` / `whole` input folders (`check_output_apart`, `OutputError` naming the file)."""
    out = Path(out)
    present = [name for name in run_files if (out / name).exists()]
    if not present or (resume and "checkpoint.pt" in present):
        return
    if not overwrite:
        hint = ("pass --resume to continue it, " if "checkpoint.pt" in present else
                "it has no checkpoint to resume; ")
        raise ConfigError(f"{out} already holds a run ({', '.join(present[:4])}); {hint}--run.overwrite true to "
                          "start over, or choose another run.out_dir")
    doomed = [out / name for name in present] + ([out / "tensorboard"] if (out / "tensorboard").is_dir() else [])
    check_output_apart(f"--run.overwrite true: {command} would delete", doomed, inputs or {}, whole=whole,
                       replaced=True)
    for path in doomed:                                            # the old run's files and TensorBoard events
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def _clean_leftovers(folder: Path) -> None:
    """Remove the temporary siblings of a killed run; restore an earlier output caught mid-swap."""
    name = folder.name
    for old in sorted(folder.parent.glob(f".{name}.tmp-*")) + sorted(folder.parent.glob(f".{name}.old-*")):
        if old.name.startswith(f".{folder.name}.old-") and not folder.exists():
            os.replace(old, folder)
        else:
            shutil.rmtree(old, ignore_errors=True)


@contextmanager
def staged_output(folder: str | Path, command: str, config: Any, *,
                  owned: Callable[[str], bool] = lambda name: False, run_id: str | None = None) -> Iterator[Path]:
    """Build the output folder `folder` of one run whole, or not at all; yields the folder to write into.

    Under `folder_lock`, the outputs go into a fresh temporary sibling `.NAME.tmp-*`; when the block
    ends normally `complete.json` (command, run id, sha256 of `config`, each file's size and sha256)
    is added and the folder is moved into place, replacing an earlier output (absent, empty, an
    earlier output of `command`, or only names `owned` accepts; anything else is refused before any
    work). An error or a kill leaves the earlier output as it was; the temporary folder is removed
    (by the next run, after a kill)."""
    folder = check_output_folder("output folder", folder, command, owned)
    with folder_lock(folder, command):
        _clean_leftovers(folder)
        _replaceable(folder, command, owned)
        stage = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.tmp-"))
        try:
            yield stage
            write_json(stage / MANIFEST_NAME, folder_manifest(stage, command, run_id or new_run_id(), config))
            stage.chmod(0o755 & ~current_umask())
            old = None
            if folder.exists():
                old = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.old-"))
                os.replace(folder, old)
            os.replace(stage, folder)
            fsync_folder(folder.parent)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
