"""Stopping a run early the way a scheduler asks: signals become a flag, the run checkpoints and says so.

SLURM (`scancel`, pre-emption, `--signal`), `timeout` and Ctrl-C send SIGTERM, SIGUSR1 or SIGINT, often to
the whole process group, DataLoader workers included. What happens:

- the training process turns the signal into a flag (`StopRequest`); the loop finishes its step, writes
  `last.pt` at that step and raises `TrainingStopped`; `cellseg train` exits with `EXIT_RESUMABLE` (75,
  sysexits' EX_TEMPFAIL: "try again later") and writes no `result.json`, so `train && predict` and SLURM
  `afterok` dependencies do not go on with a partly trained model. A second Ctrl-C interrupts at once.
- loader workers outlive the signal, so that every DDP rank can reach the agreed step with data. They start
  with the stop signals ignored (`StopRequest.shield_workers`: an ignored disposition survives fork and
  exec) and then (`worker_init_fn`) ignore SIGINT and SIGUSR1 for good. A SIGTERM is ignored when the
  training process was asked to stop too (a signal to the process group: it then shuts its workers down
  itself); otherwise (the training process ending its workers, or someone killing one worker) the worker
  ends, as torch's own handler would, after at most `WORKER_GRACE_S` of waiting for that flag.
- a worker that dies anyway after a stop was asked for is not an error: torch's SIGCHLD check, which would
  raise in the middle of whatever the loop was doing (a `torch.save`, an optimizer step), is skipped then.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import multiprocessing
import os
import signal
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)
EXIT_RESUMABLE = 75  # sysexits' EX_TEMPFAIL: "stopped early; run again (with --resume) to continue"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
# A worker's wait for its training process's stop flag: the training process sets it in a Python signal handler,
# which runs between bytecodes of its main thread, after whatever C++ call (a kernel, a sync) it is in.
WORKER_GRACE_S = 10.0
_STOP, _DONE = 0, 1  # indices of the flags shared with the workers: a stop was asked; the loop no longer needs them


class TrainingStopped(Exception):
    """Training stopped before `train.max_steps` on request; `checkpoint` holds the run at `step`."""

    def __init__(self, *, step: int, signal_name: str, checkpoint: str) -> None:
        super().__init__(f"stopped early at step {step} on {signal_name}; {checkpoint} holds the run: continue it "
                         "with the same command and --resume (or --resume auto)")
        self.step, self.signal_name, self.checkpoint = step, signal_name, checkpoint


class StopRequest:
    """Turns SIGTERM / SIGINT / SIGUSR1 into a flag the training loop polls (module docstring).

    Install it in the main thread before anything slow starts, so that a signal during set-up counts too;
    `restore` puts the previous handlers back and releases the workers.
    """

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}
        self._flags = multiprocessing.get_context("spawn").RawArray("b", 2)  # shared with the loader workers
        for sig in STOP_SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: signals cannot be caught here
                pass
        # Before multiprocessing's own exit handler (atexit runs last-registered first), which ends daemon
        # workers with SIGTERM and waits for them: they must not ignore it then.
        atexit.register(_release, weakref.ref(self))

    @property
    def requested(self) -> bool:
        """True once a stop signal arrived."""
        return self.signal_name is not None

    @property
    def worker_init_fn(self) -> Callable[[int], None]:
        """The DataLoader `worker_init_fn` that gives workers the behaviour of the module docstring."""
        return functools.partial(_init_worker, self._flags)

    def _handle(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGINT and self.requested:
            raise KeyboardInterrupt  # a second Ctrl-C: the user does not want to wait for the checkpoint
        if self.requested:
            return
        self._flags[_STOP] = 1
        self.signal_name = name
        if self._flags[_DONE]:
            log.warning("received %s after the training loop ended; finishing", name)
        else:
            log.warning("received %s: stopping at the end of the current step, with a checkpoint (resumable)%s",
                        name, "; Ctrl-C again aborts without one" if signum == signal.SIGINT else "")

    def release_workers(self) -> None:
        """The training loop is over: loader workers obey SIGTERM again (their process ends them with it)."""
        self._flags[_DONE] = 1

    def restore(self) -> None:
        """Put the previous handlers back (and `release_workers`)."""
        self.release_workers()
        for sig, handler in self._previous.items():
            if sig != signal.SIGCHLD or not self.requested:  # workers may still die of the stop signal
                signal.signal(sig, handler)
        self._previous.clear()

    @contextlib.contextmanager
    def shield_workers(self) -> Iterator[None]:
        """Start loader workers inside this block: they begin life with the stop signals ignored.

        Signals that reach this process meanwhile stay pending (blocked) and are handled after the block.
        Torch's SIGCHLD check, installed when the first workers start, is wrapped to let workers die once a
        stop is requested.
        """
        if signal.SIGTERM not in self._previous:  # not the main thread: signals are not ours to change
            yield
            return
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
            yield
        finally:
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._handle)
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            self._wrap_sigchld()

    def _wrap_sigchld(self) -> None:
        current = signal.getsignal(signal.SIGCHLD)
        if not callable(current) or getattr(current, "stop_request", None) is self:
            return

        def on_child_exit(signum: int, frame: object, check: Callable[..., Any] = current) -> None:
            if not self.requested:
                check(signum, frame)

        on_child_exit.stop_request = self  # type: ignore[attr-defined]
        self._previous.setdefault(signal.SIGCHLD, current)  # `restore` puts torch's check back
        signal.signal(signal.SIGCHLD, on_child_exit)


def _release(ref: weakref.ref[StopRequest]) -> None:
    request = ref()
    if request is not None:
        request._flags[_DONE] = 1


def _init_worker(flags: Any, worker_id: int) -> None:
    """In a loader worker: ignore SIGINT and SIGUSR1, and SIGTERM while the training process is stopping."""
    del worker_id
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, functools.partial(_worker_sigterm, flags))


def _worker_sigterm(flags: Any, signum: int, frame: object) -> None:
    deadline = time.monotonic() + WORKER_GRACE_S
    while not flags[_DONE] and time.monotonic() < deadline:
        if flags[_STOP]:
            return  # a stop of the whole group: the training process shuts this worker down when it is done
        time.sleep(0.02)
    if flags[_DONE]:
        os._exit(0)  # ended by the training process (as torch's handler does for its parent's SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)  # someone else ended this worker: die of it, so torch reports it
