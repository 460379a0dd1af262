"""nnU-Net's default trainer on a wall-clock budget: found by nnU-Net through `nnUNet_extTrainer` (this folder) and
imported inside nnU-Net's own environment, never by cellseg.

Everything of `nnUNetTrainer` is kept (network, SGD 1e-2 with Nesterov momentum 0.99, deep supervision, Dice + BCE on
regions with the ignore label, augmentation, 250 training + 50 validation iterations an epoch) except the length of
the schedule: the PolyLR decay, lr = 1e-2 (1 - t / T)^0.9, runs over the training clock t up to the budget T
instead of over a fixed number of epochs, and training stops when the clock reaches T (after the iteration that
crosses it; that epoch's validation and the final checkpoint follow). The clock charges training iterations (data
wait, forward, backward, step), not the first one (cuDNN autotuning, `torch.compile`), not validation, checkpoints or
start-up: the rule `train.time_budget_min` follows in cellseg. nnU-Net's final validation (fold `all`: its own
training cases) is skipped.

**Stopped and resumed** (a job time limit, preemption): on SIGTERM, or `CELLSEG_NNUNET_STOP_AFTER_S` seconds after
the process started, training stops after the current iteration, writes `checkpoint_latest.pth` (the interrupted
epoch is run again, whole, on resume, so nnU-Net's per-epoch logs stay one entry an epoch) and `budget_state.json`
(the clock so far), and the process exits 75; asked during validation, it stops after the validation step, with
the epoch finished. nnU-Net's `--c` then resumes it: the clock goes on from where it stopped, and the first
iteration after each start is again uncharged. Every `checkpoint_latest.pth` nnU-Net writes (its periodic ones
too) is paired with the clock at that moment in `budget_state.json`, so a hard kill resumes the checkpoint with
its own clock, never an older one; resuming a checkpoint without its clock is refused.

Environment: `CELLSEG_NNUNET_BUDGET_MIN` (required), `CELLSEG_NNUNET_ITERATIONS` and `CELLSEG_NNUNET_VAL_ITERATIONS`
(default nnU-Net's 250 and 50; the CPU quick mode uses a handful), `CELLSEG_NNUNET_STOP_AFTER_S` (optional).
`budget.json` in the output folder records the clock.
"""

import json
import os
import signal
import sys
import time

import numpy as np
import torch
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

STARTED = time.time()  # the process's start, which `CELLSEG_NNUNET_STOP_AFTER_S` counts from
POLY_EXPONENT = 0.9  # nnU-Net's PolyLRScheduler exponent
EPOCH_CAP = 10**6  # a cap only: the budget ends training
STOPPED = 75  # exit status of a training stopped to be resumed (EX_TEMPFAIL, as cellseg's commands)
STATE_FILE = "budget_state.json"


class nnUNetTrainerBudget(nnUNetTrainer):  # nnU-Net finds a trainer by its class name: keep its naming
    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):  # noqa: B008 (nnU-Net's own signature)
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.budget_s = float(os.environ["CELLSEG_NNUNET_BUDGET_MIN"]) * 60
        self.num_iterations_per_epoch = int(os.environ.get("CELLSEG_NNUNET_ITERATIONS", "250"))
        self.num_val_iterations_per_epoch = int(os.environ.get("CELLSEG_NNUNET_VAL_ITERATIONS", "50"))
        self.num_epochs = EPOCH_CAP
        stop_after = os.environ.get("CELLSEG_NNUNET_STOP_AFTER_S")
        self.deadline = STARTED + float(stop_after) if stop_after else None
        self.stop_requested = False
        self.resumed = False
        self.clock: dict | None = None  # the training clock while `run_training` runs (paired with checkpoints)
        self.clock_started = 0.0  # `time.perf_counter()` at this start, for the clock's wall time

    def load_checkpoint(self, filename_or_checkpoint):
        super().load_checkpoint(filename_or_checkpoint)
        self.resumed = True  # `--c` found a checkpoint: the clock in budget_state.json goes on

    def _on_sigterm(self, signum, frame):
        self.stop_requested = True
        self.print_to_log_file("SIGTERM: stopping after this iteration, with a checkpoint to resume from")

    def save_checkpoint(self, filename: str) -> None:
        """nnU-Net's checkpoint, and for `checkpoint_latest.pth` (the one `--c` resumes) the clock beside it."""
        super().save_checkpoint(filename)
        if self.clock is not None and self.local_rank == 0 and os.path.basename(filename) == "checkpoint_latest.pth":
            state = {**self.clock, "wall_s": self.clock["wall_s"] + time.perf_counter() - self.clock_started}
            tmp = os.path.join(self.output_folder, f".{STATE_FILE}.tmp")
            with open(tmp, "w") as fh:
                json.dump(state, fh, indent=1)
            os.replace(tmp, os.path.join(self.output_folder, STATE_FILE))

    def _clock_state(self) -> dict:
        path = os.path.join(self.output_folder, STATE_FILE)
        if self.resumed and os.path.isfile(path):
            with open(path) as fh:
                return json.load(fh)
        if self.resumed:
            raise RuntimeError(f"{path}: missing: the checkpoint `--c` resumed has no training clock beside it "
                               "(written by another trainer?); start the training afresh in another folder")
        if os.path.isfile(path):
            os.remove(path)  # left by a training that this one does not continue
        return {"charged_s": 0.0, "iterations": 0, "first_iterations_s": [], "epoch_s": [], "wall_s": 0.0}

    def _should_stop(self) -> bool:
        return self.stop_requested or (self.deadline is not None and time.time() >= self.deadline)

    def _stop(self, state: dict) -> None:
        """Checkpoint with the clock (`save_checkpoint`) so that `--c` starts at the epoch not yet finished (in the
        middle of one: that epoch again, whole), exit `STOPPED`."""
        self.current_epoch -= 1  # `save_checkpoint` stores current_epoch + 1: the epoch to start from
        self.save_checkpoint(os.path.join(self.output_folder, "checkpoint_latest.pth"))
        self.current_epoch += 1
        for loader in (self.dataloader_train, self.dataloader_val):
            finish = getattr(loader, "_finish", None)
            if finish is not None:
                finish()
        self.print_to_log_file(f"stopped at {state['charged_s']:.1f} of {self.budget_s:.0f} charged s "
                               f"({state['iterations']} iterations); `--c` resumes")
        sys.exit(STOPPED)

    def perform_actual_validation(self, save_probabilities: bool = False):
        """Skipped: nnU-Net's fold `all` would predict its own training cases; the bench predicts the tuning and
        test crops with nnU-Net's predictor instead."""
        self.print_to_log_file("final validation skipped (fold all: the bench predicts its tuning and test crops)")

    def _set_lr(self, charged_s: float) -> float:
        lr = self.initial_lr * max(0.0, 1 - charged_s / self.budget_s) ** POLY_EXPONENT
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def run_training(self):
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self.on_train_start()
        started = self.clock_started = time.perf_counter()
        state = self.clock = self._clock_state()
        first = True
        while state["charged_s"] < self.budget_s and self.current_epoch < self.num_epochs:
            self.on_epoch_start()
            self.on_train_epoch_start()  # logs the scheduler's lr; `_set_lr` sets the budget's before every step
            outputs, epoch_start = [], state["charged_s"]
            for _ in range(self.num_iterations_per_epoch):
                self._set_lr(state["charged_s"])
                tick = time.perf_counter()
                outputs.append(self.train_step(next(self.dataloader_train)))  # returns the loss on the CPU: synced
                spent = time.perf_counter() - tick
                state["iterations"] += 1
                if first:
                    state["first_iterations_s"].append(spent)  # autotuning and compilation: not charged
                    first = False
                else:
                    state["charged_s"] += spent
                if state["charged_s"] >= self.budget_s:
                    break  # the budget's last iteration: this epoch ends normally, whatever else was asked
                if self._should_stop():
                    self._stop(state)
            self.on_train_epoch_end(outputs)
            state["epoch_s"].append(state["charged_s"] - epoch_start)
            with torch.no_grad():
                self.on_validation_epoch_start()
                val = []
                for _ in range(self.num_val_iterations_per_epoch):
                    val.append(self.validation_step(next(self.dataloader_val)))
                    if self._should_stop():
                        break  # the epoch ends on the steps validated; the checkpoint below starts the next
                self.on_validation_epoch_end(val)
            self.on_epoch_end()
            if self._should_stop() and state["charged_s"] < self.budget_s:
                self._stop(state)
        self.on_train_end()
        path = os.path.join(self.output_folder, STATE_FILE)
        if self.local_rank == 0:
            firsts, epochs = state["first_iterations_s"], state["epoch_s"]
            record = {"budget_s": self.budget_s, "charged_s": state["charged_s"],
                      "first_iteration_s": firsts[0] if firsts else None, "starts": len(firsts),
                      "first_iterations_s": firsts, "wall_s": state["wall_s"] + time.perf_counter() - started,
                      "epochs": self.current_epoch, "iterations": state["iterations"],
                      "iterations_per_epoch": self.num_iterations_per_epoch,
                      "median_epoch_s": float(np.median(epochs)) if epochs else None,
                      "batch_size": self.batch_size, "patch_size": list(self.configuration_manager.patch_size),
                      "spacing": list(self.configuration_manager.spacing)}
            with open(os.path.join(self.output_folder, "budget.json"), "w") as fh:
                json.dump(record, fh, indent=1)
            if os.path.isfile(path):
                os.remove(path)
