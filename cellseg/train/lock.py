"""One training per run directory: `run_dir/train.lock`, created atomically, holding who trains there.

Two trainings in one directory would both append every step to `metrics.jsonl` and overwrite each other's
checkpoints, so the second one fails at once, naming the holder. The lock file is written complete under a
temporary name and hard-linked into place (`link` fails when the name exists, also on NFS; file systems
without hard links get an exclusive create), and holds the host, pid and start time, plus the torchrun /
SLURM job and restart count when there are any.

A lock left by a process that no longer runs is taken over with a warning: a dead pid on this host, or an
earlier attempt of this same job (a torchrun elastic restart or a SLURM requeue, which may land on another
node, but always after the previous attempt ended). A holder on another host that is not an earlier attempt
of this job cannot be checked from here: the message says which file to delete if it is gone. A lock file that
is empty or not a lock record (a node that crashed while creating it, a truncated copy) cannot name its holder;
no training leaves one so for longer than `WRITE_GRACE_S`, so an older one is taken over as stale, with a warning
saying what it held.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import weakref
from pathlib import Path
from typing import Any

from cellseg.data.write import process_alive

log = logging.getLogger(__name__)
LOCK_FILE = "train.lock"
# (job id variable, restart counter variable): an attempt with the same job id and a higher count is a later one.
JOB_COUNTERS = (("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"), ("SLURM_JOB_ID", "SLURM_RESTART_COUNT"))
# A lock appears complete (hard-linked), or, without hard links, is written right after its exclusive creation:
# an empty or unreadable one older than this is no lock being written.
WRITE_GRACE_S = 5.0


def _identity() -> dict[str, Any]:
    me: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    for job, count in JOB_COUNTERS:
        if os.environ.get(job) and os.environ.get(job) != "none":
            me[job] = os.environ[job]
            me[count] = int(os.environ.get(count, "0") or 0)
    return me


def _earlier_attempt(holder: dict[str, Any], me: dict[str, Any]) -> bool:
    return any(job in me and holder.get(job) == me[job] and int(holder.get(count, -1)) < me[count]
               for job, count in JOB_COUNTERS)


def _describe(holder: dict[str, Any]) -> str:
    if "unreadable" in holder:
        return f"the lock file is {holder['unreadable']}: it names no holder"
    return f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, started {holder.get('started', '?')}"


class RunLock:
    """Holds `run_dir/train.lock` from `acquire` until `release` (or garbage collection, or exit)."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self.me = _identity()
        self._finalizer: weakref.finalize | None = None

    def acquire(self) -> RunLock:
        """Create the lock, or take over a stale one.

        Raises:
            FileExistsError: another training holds the directory (the message names it and the lock file).
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # a holder that finishes between our attempts: try again
            if self._create():
                self._finalizer = weakref.finalize(self, _remove_if_ours, self.path, dict(self.me))
                return self
            holder = self._read()
            if holder is None:
                continue
            if "unreadable" in holder and (wait := WRITE_GRACE_S - self._age()) > 0:
                time.sleep(wait)  # perhaps a lock being written (exclusive creation): read it again
                continue
            if not self._stale(holder):
                raise FileExistsError(
                    f"{self.path.parent} is in use by another training ({_describe(holder)}); two trainings in one "
                    f"run directory would overwrite each other's checkpoints and metrics. Choose another run_dir, "
                    f"or, if that process is gone (its node failed), delete {self.path}")
            self._take_over(holder)
        raise FileExistsError(f"{self.path}: could not take the run directory's lock; another training is starting")

    def release(self) -> None:
        """Remove the lock if it is still ours."""
        if self._finalizer is not None:
            self._finalizer()

    def _create(self) -> bool:
        """Create the lock file, complete, unless it exists; False if it does."""
        text = json.dumps(self.me)
        tmp = self.path.with_name(f".{LOCK_FILE}.{self.me['host']}-{self.me['pid']}")
        tmp.write_text(text)
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: exclusive creation, then the content
            return self._create_exclusive(text)
        finally:
            tmp.unlink(missing_ok=True)

    def _create_exclusive(self, text: str) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        return True

    def _read(self) -> dict[str, Any] | None:
        """The holder's record; {"unreadable": why, "text": ...} for a file that is not one; None: no lock."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except OSError as err:
            return {"unreadable": f"unreadable ({err.strerror})", "text": None}
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict) and "host" in data and "pid" in data:
            return data
        return {"unreadable": "empty" if not text.strip() else f"not a lock record ({text[:40]!r})", "text": text}

    def _age(self) -> float:
        """Seconds since the lock file was last written (0 if it is gone)."""
        try:
            return time.time() - self.path.stat().st_mtime
        except OSError:
            return 0.0

    def _stale(self, holder: dict[str, Any]) -> bool:
        if "unreadable" in holder:
            return self._age() >= WRITE_GRACE_S  # `acquire` waited that long: no lock being written
        if _earlier_attempt(holder, self.me):
            return True
        pid = holder.get("pid")
        return isinstance(pid, int) and process_alive(str(holder.get("host")), pid) is False

    def _take_over(self, holder: dict[str, Any]) -> None:
        """Move the stale lock aside (only one process can), check it is the one judged stale, drop it."""
        aside = self.path.with_name(f".{LOCK_FILE}.stale-{self.me['host']}-{self.me['pid']}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # someone else moved it first: race for the new lock
        try:
            text: str | None = aside.read_text()
        except OSError:
            text = None
        if not _same_lock(text, holder):  # a new lock appeared in between: give it back
            with contextlib.suppress(OSError):
                os.link(aside, self.path)
            aside.unlink(missing_ok=True)
            return
        aside.unlink(missing_ok=True)
        if "unreadable" in holder:
            log.warning("%s: taking over %s as stale: %s, and no training leaves its lock so for %.0f s",
                        self.path.parent, self.path, _describe(holder), WRITE_GRACE_S)
        else:
            log.warning("%s: taking over the lock of a training that no longer runs (%s)", self.path.parent,
                        _describe(holder))


def _same_lock(text: str | None, holder: dict[str, Any]) -> bool:
    """Whether the lock file's `text` is the one `holder` was read from."""
    if "unreadable" in holder:
        return text == holder["text"]
    try:
        return json.loads(text or "") == holder
    except ValueError:
        return False


def _remove_if_ours(path: Path, me: dict[str, Any]) -> None:
    try:
        if json.loads(path.read_text()) == me:
            path.unlink()
    except (OSError, ValueError):
        pass
