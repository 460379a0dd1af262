"""No non-finite number reaches a checkpoint, a segmentation or a submission without an error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from faultkit import config

from cellseg.cli import main
from cellseg.data.crops import Crop, Geometry
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore
from cellseg.eval.submit import write_submission
from cellseg.postprocess.apply import postprocess_store
from cellseg.postprocess.params import ParamSet
from cellseg.runtime.checkpoint import load
from cellseg.train.run_checkpoints import CheckpointKeeper, NonFiniteError
from cellseg.train.trainer import Trainer, train

GRID = Grid(translation_nm=(0.0, 0.0, 0.0), shape_vox=(4, 4, 4), voxel_size_nm=(8.0, 8.0, 8.0))
DIVERGE = ("optim.lr=1e20",)  # AdamW moves every weight by about lr: activations overflow at the next step


def _finite(path: Path) -> bool:
    model = load(path)["model"]
    return all(torch.isfinite(v).all() for v in model.values() if v.is_floating_point())


def test_diverging_run_stops_naming_the_step_and_saves_nothing_non_finite(tiny_synth_root: Path,
                                                                          tmp_path: Path) -> None:
    run = tmp_path / "run"
    with pytest.raises(NonFiniteError, match=r"^step 2: NaN or infinite loss or gradients"):
        train(config(tiny_synth_root, run, "train.max_steps=8", "train.checkpoint_every=1", *DIVERGE))
    saved = sorted((run / "checkpoints").glob("*.pt"))
    assert [p.name for p in saved] == ["last.pt"] and load(saved[0])["step"] == 1 and _finite(saved[0])
    assert not (run / "result.json").exists()
    assert not (run / "train.lock").exists()
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r["train"]["loss"]) for r in logged if "train" in r)  # no NaN logged as a loss


def test_cli_reports_divergence_in_one_line(tiny_synth_root: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from faultkit import SMOKE, overrides

    assert main(["train", str(SMOKE), *overrides(tiny_synth_root, tmp_path / "run"), "train.max_steps=4",
                 *DIVERGE]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("cellseg train: error: step 2: NaN or infinite loss") and "Traceback" not in "".join(err)


def _nan_output_at(trainer: Trainer, steps: set[int]) -> None:
    """Make the model's output NaN during the given steps (1-based) only."""
    def hook(module: torch.nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
        return output * float("nan") if trainer.s.state.step + 1 in steps else output

    trainer.s.model.register_forward_hook(hook)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])  # fp16: with a GradScaler, which must still end the step
def test_skip_mode_drops_the_update_and_counts_it(tiny_synth_root: Path, tmp_path: Path, precision: str) -> None:
    trainer = Trainer(config(tiny_synth_root, tmp_path / "run", "train.max_steps=5", "train.val_every=5",
                             "train.nonfinite=skip", f"train.precision={precision}"))
    _nan_output_at(trainer, {3})
    before = {}

    def remember(module: torch.nn.Module, args: object) -> None:
        before[trainer.s.state.step] = {k: v.detach().clone() for k, v in trainer.s.model.named_parameters()}

    trainer.s.model.register_forward_pre_hook(remember)
    trainer.fit()
    trainer.close()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    skips = {r["step"]: r["train"]["nonfinite_skips"] for r in records if "train" in r}
    assert skips == {1: 0, 2: 0, 3: 1, 4: 0, 5: 0} and trainer.s.state.step == 5
    for key, value in before[2].items():  # step 3 changed no parameter (BatchNorm statistics move in forward)
        torch.testing.assert_close(before[3][key], value, rtol=0, atol=0)
    assert _finite(tmp_path / "run" / "checkpoints" / "best.pt")


def test_skip_mode_gives_up_after_the_limit(tiny_synth_root: Path, tmp_path: Path) -> None:
    trainer = Trainer(config(tiny_synth_root, tmp_path / "run", "train.max_steps=9", "train.nonfinite=skip",
                             "train.max_nonfinite_skips=3"))
    _nan_output_at(trainer, set(range(2, 10)))
    with pytest.raises(NonFiniteError, match=r"steps 2-4: .* 3 steps in a row \(train.max_nonfinite_skips=3\)"):
        trainer.fit()
    trainer.close()


def test_keeper_never_writes_non_finite_weights(tmp_path: Path) -> None:
    keeper = CheckpointKeeper(tmp_path)
    state = {"model": {"w": torch.tensor([1.0, float("nan")])}, "ema": None, "step": 7}
    with pytest.raises(NonFiniteError, match="step 7: model weights hold NaN or infinite values \\(w\\)"):
        keeper.save_last(state)
    with pytest.raises(NonFiniteError):
        keeper.offer(state, 7, 0.5)
    assert not list(tmp_path.iterdir())


def _probabilities(tmp_path: Path, values: np.ndarray) -> PredictionStore:
    store = PredictionStore.create(tmp_path / "pred.zarr", kind="probabilities", channels=["er"])
    store.write_crop("crop1", GRID, {"er": values.astype(np.float32)})
    return store


def test_postprocess_refuses_nan_probabilities(tmp_path: Path) -> None:
    probs = np.full((4, 4, 4), 0.9, np.float32)
    probs[1, 2, 3] = np.nan
    store = _probabilities(tmp_path, probs)
    with pytest.raises(ValueError, match=r"pred.zarr/crop1/er: 1 NaN or infinite probabilities"):
        postprocess_store(store, tmp_path / "seg.zarr", params=ParamSet(), device="cpu", progress=False, workers=1)
    assert not (tmp_path / "seg.zarr" / "crop1").exists()


def _crop() -> dict[int, Crop]:
    geometry = Geometry(voxel_size_nm=(8.0, 8.0, 8.0), translation_nm=(0.0, 0.0, 0.0), shape_vox=(4, 4, 4))
    return {1: Crop(id=1, dataset="d", labels={"er": geometry})}


def test_submit_refuses_nan_probabilities(tmp_path: Path) -> None:
    probs = np.full((4, 4, 4), 0.9, np.float32)
    probs[0, 0, 0] = np.inf
    store = _probabilities(tmp_path, probs)
    # A probability store is a multiscale group per channel: the submission reads it on the crop's grid.
    with pytest.raises(ValueError, match=r"pred.zarr/crop1/er: 1 NaN or infinite probabilities"):
        write_submission(store.path, _crop(), tmp_path / "sub.zip")
    assert not (tmp_path / "sub.zip").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["pred.zarr"]  # no temporary left either


@pytest.mark.parametrize("threshold", ["2", "-0.1", "1"])
def test_submit_refuses_a_threshold_that_empties_every_mask(tmp_path: Path, threshold: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    store = _probabilities(tmp_path, np.full((4, 4, 4), 0.9, np.float32))
    out = tmp_path / "sub.zip"
    assert main(["submit", str(store.path), "--out", str(out), "--threshold", threshold]) == 2
    assert "threshold must be in [0, 1)" in capsys.readouterr().err and not out.exists()
