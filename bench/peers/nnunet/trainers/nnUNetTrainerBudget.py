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

Environment: `CELLSEG_NNUNET_BUDGET_MIN` (required), `CELLSEG_NNUNET_ITERATIONS` and `CELLSEG_NNUNET_VAL_ITERATIONS`
(default nnU-Net's 250 and 50; the CPU quick mode uses a handful). `budget.json` in the output folder records the clock.
"""

import json
import os
import time

import numpy as np
import torch
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

POLY_EXPONENT = 0.9  # nnU-Net's PolyLRScheduler exponent
EPOCH_CAP = 10**6  # a cap only: the budget ends training


class nnUNetTrainerBudget(nnUNetTrainer):  # nnU-Net finds a trainer by its class name: keep its naming
    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):  # noqa: B008 (nnU-Net's own signature)
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.budget_s = float(os.environ["CELLSEG_NNUNET_BUDGET_MIN"]) * 60
        self.num_iterations_per_epoch = int(os.environ.get("CELLSEG_NNUNET_ITERATIONS", "250"))
        self.num_val_iterations_per_epoch = int(os.environ.get("CELLSEG_NNUNET_VAL_ITERATIONS", "50"))
        self.num_epochs = EPOCH_CAP

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
        self.on_train_start()
        started = time.perf_counter()
        charged, iterations, first_s, epoch_s = 0.0, 0, None, []
        while charged < self.budget_s and self.current_epoch < self.num_epochs:
            self.on_epoch_start()
            self.on_train_epoch_start()  # logs the scheduler's lr; `_set_lr` sets the budget's before every step
            outputs, epoch_start = [], charged
            for _ in range(self.num_iterations_per_epoch):
                self._set_lr(charged)
                tick = time.perf_counter()
                outputs.append(self.train_step(next(self.dataloader_train)))  # returns the loss on the CPU: synced
                spent = time.perf_counter() - tick
                iterations += 1
                if first_s is None:
                    first_s = spent  # autotuning and compilation: not charged
                else:
                    charged += spent
                if charged >= self.budget_s:
                    break
            self.on_train_epoch_end(outputs)
            epoch_s.append(charged - epoch_start)
            with torch.no_grad():
                self.on_validation_epoch_start()
                val = [self.validation_step(next(self.dataloader_val)) for _ in range(self.num_val_iterations_per_epoch)]
                self.on_validation_epoch_end(val)
            self.on_epoch_end()
        self.on_train_end()
        if self.local_rank == 0:
            record = {"budget_s": self.budget_s, "charged_s": charged, "first_iteration_s": first_s,
                      "wall_s": time.perf_counter() - started, "epochs": self.current_epoch, "iterations": iterations,
                      "iterations_per_epoch": self.num_iterations_per_epoch,
                      "median_epoch_s": float(np.median(epoch_s)) if epoch_s else None,
                      "batch_size": self.batch_size, "patch_size": list(self.configuration_manager.patch_size),
                      "spacing": list(self.configuration_manager.spacing)}
            with open(os.path.join(self.output_folder, "budget.json"), "w") as fh:
                json.dump(record, fh, indent=1)
