"""Local encoder checkpoints: loaded with an honest report, never downloaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch

from cellseg.models import build_model, load_encoder_checkpoint

ENCODER = "resnet18"  # the resnet_2d tiny preset's encoder


@pytest.fixture(scope="module")
def imagenet_like_state() -> dict[str, torch.Tensor]:
    """What an ImageNet timm checkpoint holds: an RGB stem and a classifier head (``fc.*``)."""
    torch.manual_seed(0)
    return timm.create_model(ENCODER, pretrained=False, in_chans=3).state_dict()


def _tiny_resnet_2d():
    return build_model("resnet_2d", 1, 2, preset="tiny")


def test_full_checkpoint_loads_with_head_unexpected_and_stem_adapted(
    tmp_path: Path, imagenet_like_state
) -> None:
    path = tmp_path / "resnet18.pth"
    torch.save(imagenet_like_state, path)
    model = _tiny_resnet_2d()
    report = load_encoder_checkpoint(model.encoder, path)
    assert report.unexpected == ("fc.bias", "fc.weight")
    assert report.missing == () and report.mismatched == ()
    assert report.adapted == ("conv1.weight",)
    assert len(report.loaded) == len(model.encoder.state_dict())
    encoder_state = model.encoder.state_dict()
    assert torch.equal(encoder_state["layer1.0.conv1.weight"], imagenet_like_state["layer1.0.conv1.weight"])
    rgb_summed = imagenet_like_state["conv1.weight"].sum(dim=1, keepdim=True)
    assert torch.allclose(encoder_state["conv1.weight"], rgb_summed)
    assert "2 unexpected (ignored): fc.bias, fc.weight" in report.summary()


def test_missing_keys_and_wrappers_are_reported(tmp_path: Path, imagenet_like_state) -> None:
    state = {
        f"module.{key}": value for key, value in imagenet_like_state.items() if key != "layer4.1.bn2.bias"
    }
    path = tmp_path / "wrapped.pt"
    torch.save({"state_dict": state, "epoch": 3}, path)
    report = load_encoder_checkpoint(_tiny_resnet_2d().encoder, path)
    assert report.missing == ("layer4.1.bn2.bias",)
    assert "1 missing (random init): layer4.1.bn2.bias" in report.summary()


def test_build_model_loads_the_checkpoint_param(tmp_path: Path, imagenet_like_state) -> None:
    path = tmp_path / "resnet18.pth"
    torch.save(imagenet_like_state, path)
    model = build_model("resnet_2d", 1, 2, preset="tiny", encoder_checkpoint=str(path))
    wanted = imagenet_like_state["layer2.0.conv1.weight"]
    assert torch.equal(model.encoder.state_dict()["layer2.0.conv1.weight"], wanted)


def test_safetensors_files_load(tmp_path: Path, imagenet_like_state) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "resnet18.safetensors"
    save_file({key: value.contiguous() for key, value in imagenet_like_state.items()}, str(path))
    assert load_encoder_checkpoint(_tiny_resnet_2d().encoder, path).unexpected == ("fc.bias", "fc.weight")


def test_bad_paths_and_files_give_clear_errors(tmp_path: Path) -> None:
    encoder = _tiny_resnet_2d().encoder
    with pytest.raises(
        FileNotFoundError, match=r"nope\.pth' does not exist \(weights are never downloaded\)"
    ):
        load_encoder_checkpoint(encoder, tmp_path / "nope.pth")
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"could not read .*garbage\.pth"):
        load_encoder_checkpoint(encoder, garbage)
    foreign = tmp_path / "foreign.pth"
    torch.save({"decoder.weight": torch.zeros(2)}, foreign)
    with pytest.raises(ValueError, match=r"none of the 1 tensors .* match the encoder's names"):
        load_encoder_checkpoint(encoder, foreign)
