"""Faults met at prediction time: broken weights, another class order, NaN probabilities. Each is refused with a
message naming the file or the channels, before anything reaches a store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from cellseg.config.inference import InferConfig
from cellseg.data.arrays import MultiscaleImage
from cellseg.data.grid import Grid
from cellseg.data.write import write_multiscale
from cellseg.infer.engine import Window, predict_slabs
from cellseg.infer.predict import predict_run
from cellseg.infer.run import load_run
from cellseg.runtime.checkpoint import load, save_atomic
from cellseg.runtime.hardware import resolve_precision

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "smoke"
OPTS = InferConfig(tta=1, overlap=0.0, progress=False, checkpoint="last")


@pytest.fixture(scope="module")
def run(tiny_synth_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny trained 3D run (4 CPU steps)."""
    from cellseg.config import load_run_config
    from cellseg.train.trainer import train

    run_dir = tmp_path_factory.mktemp("runs") / "unet_3d"
    train(load_run_config(SMOKE / "unet_3d.yaml", [f"data.root={tiny_synth_root}", f"run_dir={run_dir}"]))
    return run_dir


def _copy(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def test_non_finite_weights_are_refused_naming_the_checkpoint(run: Path, tmp_path: Path) -> None:
    broken = _copy(run, tmp_path)
    path = broken / "checkpoints" / "last.pt"
    ckpt = load(path)
    name = next(k for k, v in ckpt["model"].items() if v.is_floating_point())
    ckpt["model"][name] = torch.full_like(ckpt["model"][name], float("nan"))
    ckpt["ema"] = None
    save_atomic(ckpt, path)
    with pytest.raises(ValueError, match=rf"last\.pt \(model weights\): 1 weight tensors hold NaN.*{name}"):
        load_run(broken, "last")
    out = tmp_path / "pred.zarr"
    with pytest.raises(ValueError, match="hold NaN"):
        predict_run(broken, "val", out, OPTS)
    assert not out.exists()  # nothing half-written


def test_a_checkpoint_of_another_class_order_is_refused(run: Path, tmp_path: Path) -> None:
    swapped = _copy(run, tmp_path)
    meta = json.loads((swapped / "meta.json").read_text())
    meta["channels"][0], meta["channels"][1] = meta["channels"][1], meta["channels"][0]
    (swapped / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"last\.pt.*channels"):
        load_run(swapped, "last")


class _NanModel(torch.nn.Module):
    """A model whose second output channel is NaN where the input is bright: a broken model, not ours mocked."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nan = torch.where(x > 0.5, torch.full_like(x, float("nan")), x)
        return torch.cat([x, nan], dim=1)


def test_nan_probabilities_stop_prediction_naming_the_channel(tmp_path: Path) -> None:
    em = np.full((24, 24, 24), 100, np.uint8)
    em[12:, :, :] = 250  # bright planes: NaN logits in channel 1 from plane 12 on
    write_multiscale(tmp_path / "em", em, voxel_size_nm=(8, 8, 8), translation_nm=(4, 4, 4), kind="em", num_levels=1)
    image = MultiscaleImage(tmp_path / "em")
    grid = Grid.of(translation_nm=(4, 4, 4), shape_vox=(24, 24, 24), voxel_size_nm=(8, 8, 8))
    device = torch.device("cpu")
    window = Window(patch_vox=(8, 8, 8), device=device, precision=resolve_precision("auto", device), overlap=0.0)
    slabs = predict_slabs(_NanModel(), image, grid, window, num_outputs=2)
    with pytest.raises(ValueError, match=r"NaN or infinite probabilities in output channel\(s\) \[1\]"):
        for _ in slabs:
            pass
