"""Start-up records (`cellseg.train.warm_start`): keyed by what the measurements depend on, written atomically,
an unreadable one ignored; the loss compiles for the model output's layout, so training does not recompile it;
on a GPU a second job reuses the first one's probe and compile decisions."""

import json
import logging
from pathlib import Path

import pytest
import torch

from cellseg.config import load_run_config
from cellseg.data.augment import channels_first
from cellseg.losses import SegmentationLoss
from cellseg.models import build_model
from cellseg.train.compile_choice import maybe_compile_loss
from cellseg.train.trainer import train
from cellseg.train.warm_start import FORMAT, StartupRecord, startup_key

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "smoke" / "unet_3d.yaml"


def _key(cfg, model, batch=2):
    return startup_key(cfg, model, device=torch.device("cpu"), batch=batch, fmt=torch.contiguous_format,
                       precision="fp32")


def test_the_key_changes_with_what_the_measurements_depend_on():
    cfg = load_run_config(SMOKE)
    model = build_model("unet_3d", 1, cfg.data.num_target_channels, preset="tiny")
    base = _key(cfg, model)
    assert base == _key(cfg, model)  # deterministic
    assert base != _key(cfg, model, batch=4)
    assert base != _key(load_run_config(SMOKE, ["data.patch_shape_vox=[16,32,32]"]), model)
    assert base != _key(load_run_config(SMOKE, ["loss.dice_weight=0.5"]), model)
    assert base != _key(load_run_config(SMOKE, ["train.compile_mode=max-autotune"]), model)
    wider = build_model("unet_3d", 1, cfg.data.num_target_channels, preset="tiny", norm="instance")
    assert base != _key(cfg, wider)


def test_record_round_trips_and_writes_only_what_changed(tmp_path):
    record = StartupRecord("k1", folder=tmp_path)
    assert record.get("gpu_step_bytes") is None and not record.loaded
    record.put("gpu_step_bytes", 123)
    record.put("compile", {"compiled": True, "compiled_step_s": 0.1, "eager_step_s": 0.2})
    record.save()
    assert json.loads((tmp_path / "k1.json").read_text())["format"] == FORMAT
    assert [p.name for p in tmp_path.iterdir()] == ["k1.json"]  # no temporary file left
    again = StartupRecord("k1", folder=tmp_path)
    assert again.get("gpu_step_bytes") == 123 and again.get("compile")["compiled"] is True
    mtime = (tmp_path / "k1.json").stat().st_mtime_ns
    again.put("gpu_step_bytes", 123)
    again.save()  # nothing changed: not rewritten
    assert (tmp_path / "k1.json").stat().st_mtime_ns == mtime
    nothing = StartupRecord.disabled()
    nothing.put("gpu_step_bytes", 1)
    nothing.save()
    assert nothing.get("gpu_step_bytes") is None and nothing.path is None


def test_an_unreadable_record_is_named_and_measured_again(tmp_path, caplog):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "old.json").write_text(json.dumps({"format": FORMAT + 1, "gpu_step_bytes": 5}))
    with caplog.at_level(logging.WARNING, logger="cellseg.train.warm_start"):
        assert StartupRecord("bad", folder=tmp_path).get("gpu_step_bytes") is None
        assert StartupRecord("old", folder=tmp_path).get("gpu_step_bytes") is None
    assert "bad.json is unreadable" in caplog.text and "old.json is unreadable" in caplog.text
    record = StartupRecord("bad", folder=tmp_path)
    record.put("gpu_step_bytes", 7)
    record.save()  # replaced by a good one
    assert StartupRecord("bad", folder=tmp_path).get("gpu_step_bytes") == 7


def test_an_unwritable_cache_folder_costs_only_the_record(tmp_path, caplog):
    folder = tmp_path / "not-a-folder"
    folder.write_text("a file where the cache folder should be")  # unwritable for root too
    record = StartupRecord("k", folder=folder)
    record.put("gpu_step_bytes", 1)
    with caplog.at_level(logging.WARNING, logger="cellseg.train.warm_start"):
        record.save()
    assert "not written" in caplog.text and folder.read_text().startswith("a file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-folder"]


def test_the_loss_compiles_for_the_model_outputs_layout():
    """Probed on channels-last logits, the compiled loss takes the model's channels-last output and the
    augmentation's targets without recompiling (the first training step used to recompile it: 5-7 s on an H200)."""
    import torch._dynamo

    cfg = load_run_config(SMOKE, ["train.compile=on", "data.patch_shape_vox=[8,8,8]"])
    c = cfg.data.num_target_channels
    shape = (2, c, 8, 8, 8)
    logits = torch.randn(shape).contiguous(memory_format=torch.channels_last_3d).requires_grad_()
    layout = [(tuple(logits.shape), logits.stride(), logits.dtype)]
    criterion = SegmentationLoss(bce_weight=1.0, dice_weight=1.0, channel_weights=[1.0] * c)
    torch._dynamo.reset()
    loss_fn, record = maybe_compile_loss(criterion, cfg, torch.device("cpu"), precision="fp32", batch=2,
                                         fmt=torch.channels_last_3d, layout=layout)
    assert record["compiled"] is True
    voxels = (2, 8 * 8 * 8, c)  # targets laid out as the augmentation hands them over (channel-fastest)
    target = channels_first(torch.rand(voxels) > 0.5, (8, 8, 8))
    known = channels_first(torch.rand(voxels) > 0.2, (8, 8, 8))
    with torch._dynamo.config.patch(error_on_recompile=True):
        value = loss_fn(logits, target, known)
    torch.testing.assert_close(value, criterion(logits, target, known), rtol=1e-4, atol=1e-5)


def test_cpu_jobs_keep_no_record(tiny_synth_root, tmp_path, monkeypatch):
    monkeypatch.setenv("CELLSEG_CACHE", str(tmp_path / "cache"))
    train(load_run_config(SMOKE, [f"data.root={tiny_synth_root}", f"run_dir={tmp_path / 'run'}",
                                  "train.max_steps=1"]))
    assert not (tmp_path / "cache" / "startup").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_second_gpu_job_reuses_the_first_ones_measurements(tiny_synth_root, tmp_path, monkeypatch):
    monkeypatch.setenv("CELLSEG_CACHE", str(tmp_path / "cache"))
    overrides = [f"data.root={tiny_synth_root}", "train.device=cuda", "train.compile=auto", "train.max_steps=2",
                 "train.val_every=100", "data.resident=gpu",
                 "train.background_compile=false"]  # the compile decisions are made before the first step
    metas = []
    for name in ("first", "second"):
        run = tmp_path / name
        train(load_run_config(SMOKE, [*overrides, f"run_dir={run}"]))
        metas.append(json.loads((run / "meta.json").read_text()))
    records = list((tmp_path / "cache" / "startup").glob("*.json"))
    assert len(records) == 1
    saved = json.loads(records[0].read_text())
    assert saved["gpu_step_bytes"] > 0 and {"compile", "compile_loss"} <= saved.keys()
    first, second = metas
    assert "reused" not in first["compile"] and second["compile"]["reused"] is True
    assert second["compile"]["compiled"] == first["compile"]["compiled"]
    assert second["compile_loss"]["compiled"] == first["compile_loss"]["compiled"]
    assert second["resident_data"] == first["resident_data"] == "gpu"
    # the same key with the record switched off measures again and leaves the record as it was
    run = tmp_path / "third"
    train(load_run_config(SMOKE, [*overrides, f"run_dir={run}", "train.startup_cache=false"]))
    assert "reused" not in json.loads((run / "meta.json").read_text())["compile"]
    assert json.loads(records[0].read_text()) == saved


def test_the_loss_probes_targets_have_the_augmentations_layout():
    """Dynamo guards on strides: the targets the loss is compiled for must be laid out as the augmentation's."""
    from cellseg.config.schema import AugmentConfig
    from cellseg.data.augment import GpuAugment
    from cellseg.train.compile_choice import _loss_inputs

    cfg = load_run_config(SMOKE, ["data.patch_shape_vox=[8,8,8]"])
    c, spatial = cfg.data.num_target_channels, cfg.data.model_patch_vox
    augment = GpuAugment(AugmentConfig(enabled=False), num_classes=c, patch_shape_vox=cfg.data.patch_shape_vox,
                         voxel_size_nm=cfg.data.voxel_size_nm)
    packed = torch.zeros((2, -(-c // 8), *spatial), dtype=torch.uint8)
    _, target, known = augment({"image": torch.zeros((2, 1, *spatial), dtype=torch.uint8), "target_bits": packed,
                                "known_bits": packed}, 0)
    _, probe_target, probe_known = _loss_inputs(cfg, torch.device("cpu"), precision="fp32", batch=2,
                                                fmt=torch.channels_last_3d, layout=None)
    assert probe_target.shape == target.shape and probe_target.stride() == target.stride()
    assert probe_known.stride() == known.stride() and probe_known.dtype == known.dtype == torch.bool
