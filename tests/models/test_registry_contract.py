"""One contract for every registered architecture, proven by walking the registry (tiny presets, CPU)."""

from __future__ import annotations

import math

import pytest
import torch

from cellseg.models import build_model, list_models, preset_patch_vox, resolve_params

EXPECTED_NAMES = ["resnet_2d", "resnet_3d", "swin_2d", "swin_3d", "unet_2d", "unet_3d", "vit_2d", "vit_3d"]
NUM_CLASSES = 3
BATCH = 2


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _tiny(name: str, **params):
    return build_model(name, 1, NUM_CLASSES, preset="tiny", **params)


def test_registry_lists_exactly_the_eight_architectures() -> None:
    assert list_models() == EXPECTED_NAMES


@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_forward_backward_at_tiny_preset(name: str) -> None:
    model = _tiny(name)
    patch = model.spec.default_patch_vox
    logits = model(torch.randn(BATCH, 1, *patch))
    assert isinstance(logits, torch.Tensor)
    assert logits.shape == (BATCH, NUM_CLASSES, *patch)
    assert torch.isfinite(logits).all()
    logits.square().mean().backward()
    first_name, first = next(iter(model.named_parameters()))
    assert first.grad is not None and first.grad.abs().sum() > 0, f"no gradient reached {first_name}"
    # Every parameter takes part (DDP can then run without find_unused_parameters).
    unused = [key for key, param in model.named_parameters() if param.grad is None]
    assert not unused, f"parameters without gradient: {unused}"


@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_spec_is_consistent(name: str) -> None:
    spec = _tiny(name).spec
    axes = "zyx"[-spec.spatial_dims :]
    assert spec.name == name and spec.axes == axes
    assert name.endswith(f"_{spec.spatial_dims}d")
    assert len(spec.input_divisor) == len(spec.default_patch_vox) == len(spec.default_voxel_size_nm)
    assert set(spec.tta_axes) == set(axes) and set(spec.tta_transpose_axes) <= set(axes)
    for preset in ("tiny", "default"):
        with torch.device("meta"):
            divisor = build_model(name, 1, NUM_CLASSES, preset=preset).input_divisor
        patch = preset_patch_vox(name, preset)
        assert all(size % step == 0 for size, step in zip(patch, divisor, strict=True)), (
            preset,
            patch,
            divisor,
        )
    # The JSON form of the spec (meta.json) rebuilds the same params.
    assert resolve_params(name, **spec.to_dict()["params"]) == resolve_params(name, preset="tiny")


@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_anisotropic_patch_where_the_divisor_allows(name: str) -> None:
    model = _tiny(name).eval()
    first, *rest = model.spec.default_patch_vox
    patch = (first, *(2 * size for size in rest))  # e.g. 16x32x32 in 3D, 16x32 in 2D
    with torch.no_grad():
        logits = model(torch.randn(1, 1, *patch))
    assert logits.shape == (1, NUM_CLASSES, *patch)


@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_wrong_shapes_raise_a_value_error_naming_the_valid_ones(name: str) -> None:
    model = _tiny(name)
    divisor = model.spec.input_divisor
    patch = list(model.spec.default_patch_vox)
    patch[-1] += 1
    with pytest.raises(ValueError, match=r"multiples of") as info:
        model(torch.randn(1, 1, *patch))
    message = str(info.value)
    assert name in message and str(divisor) in message and f"X={patch[-1]}" in message
    with pytest.raises(ValueError, match=r"dims"):
        model(torch.randn(1, 1, *model.spec.default_patch_vox, 4))
    with pytest.raises(ValueError, match=r"input channel"):
        model(torch.randn(1, 2, *model.spec.default_patch_vox))


@pytest.mark.parametrize("name", ["unet_2d", "unet_3d", "resnet_2d", "resnet_3d"])
def test_deep_supervision_lists_in_training_and_one_tensor_in_eval(name: str) -> None:
    model = _tiny(name, deep_supervision=True)
    patch = model.spec.default_patch_vox
    image = torch.randn(BATCH, 1, *patch)
    outputs = model.train()(image)
    assert isinstance(outputs, list) and len(outputs) >= 2
    assert outputs[0].shape == (BATCH, NUM_CLASSES, *patch)
    sizes = [math.prod(item.shape[2:]) for item in outputs]
    assert sizes == sorted(sizes, reverse=True)
    with torch.no_grad():
        assert model.eval()(image).shape == (BATCH, NUM_CLASSES, *patch)


def test_anisotropic_strides_set_a_per_axis_divisor() -> None:
    model = build_model("unet_3d", 1, 2, features_per_stage=[4, 8, 16], strides=[[1, 2, 2], 2])
    assert model.spec.input_divisor == (2, 4, 4)
    assert model(torch.randn(1, 1, 6, 8, 12)).shape == (1, 2, 6, 8, 12)


def test_params_are_checked_by_name_and_value() -> None:
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['widht'\].*valid: features_per_stage"):
        build_model("unet_3d", 1, 2, widht=3)
    with pytest.raises(ValueError, match=r"norm must be one of batch, instance, group"):
        build_model("unet_3d", 1, 2, preset="tiny", norm="layer")
    with pytest.raises(ValueError, match=r"unknown model 'unet_4d'; valid names: resnet_2d"):
        build_model("unet_4d", 1, 2)
    with pytest.raises(ValueError, match=r"unknown preset 'huge'.*valid: default, tiny"):
        build_model("unet_3d", 1, 2, preset="huge")
    with pytest.raises(ValueError, match=r"patch_size must be a power of two"):
        resolve_params("vit_3d", patch_size=12)
    with pytest.raises(ValueError, match=r"unknown timm encoder"):
        resolve_params("resnet_2d", encoder="not_a_model")
    with pytest.raises(ValueError, match=r"model.params.qk_norm: expected bool, got 'yes'"):
        resolve_params("vit_3d", qk_norm="yes")
    # `--set ...layer_scale=1e-4` or YAML's 1e-4 (a string to YAML 1.1) is the float it means
    assert resolve_params("vit_3d", layer_scale="1e-4").layer_scale == 1e-4


def test_yaml_lists_become_tuples_and_keyword_params_override_the_preset() -> None:
    params = resolve_params("unet_3d", preset="tiny", features_per_stage=[2, 4])
    assert params.features_per_stage == (2, 4)
    assert params.norm == "batch"


@pytest.mark.parametrize("norm", ["instance", "group"])
def test_selectable_norms_build_and_run(norm: str) -> None:
    model = _tiny("unet_3d", norm=norm)
    assert model(torch.randn(BATCH, 1, 16, 16, 16)).shape == (BATCH, NUM_CLASSES, 16, 16, 16)


@pytest.mark.parametrize("name", ["vit_3d", "swin_3d"])
def test_activation_checkpointing_gives_the_same_gradients(name: str) -> None:
    """`use_checkpoint=True` recomputes activations in backward; weights and gradients are unchanged."""
    grads = []
    for use in (False, True):
        torch.manual_seed(0)
        model = build_model(name, 1, 3, preset="tiny", use_checkpoint=use).train()
        torch.manual_seed(1)
        out = model(torch.rand(2, 1, *model.spec.default_patch_vox))
        (out[0] if isinstance(out, list) else out).square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize("name", ["vit_2d", "vit_3d"])
def test_vit_stabilisers_add_their_parameters_and_train(name: str) -> None:
    """`qk_norm` adds a LayerNorm on queries and keys per block, `layer_scale` one learned factor per residual
    branch starting at its value; both take part in backward."""
    plain, stable = _tiny(name), _tiny(name, qk_norm=True, layer_scale=1e-4)
    extra = {key for key, _ in stable.named_parameters()} - {key for key, _ in plain.named_parameters()}
    assert any(".attn.q_norm." in key for key in extra) and any(".attn.k_norm." in key for key in extra)
    gammas = [param for key, param in stable.named_parameters() if key.endswith(("ls1.gamma", "ls2.gamma"))]
    assert len(gammas) == 2 * len(stable.encoder.blocks)
    assert all(torch.all(g == 1e-4) for g in gammas)
    out = stable(torch.randn(BATCH, 1, *stable.spec.default_patch_vox))
    (out[0] if isinstance(out, list) else out).square().mean().backward()
    assert all(param.grad is not None for key, param in stable.named_parameters() if key in extra)
    with pytest.raises(ValueError, match=r"layer_scale must be in \(0, 1\]"):
        resolve_params(name, layer_scale=0.0)


@pytest.mark.parametrize("name", ["vit_2d", "vit_3d"])
def test_vit_convolutional_stem_replaces_the_patchify_layer_and_can_feed_the_skips(name: str) -> None:
    """`embed="conv"` tokenises with log2(patch) stride-2 stages instead of one patch-sized convolution;
    `skips="embed"` takes decoder levels 1 .. n-1 from those stages, so no transformer skip is projected up."""
    plain = _tiny(name)
    stem = _tiny(name, embed="conv")
    hybrid = _tiny(name, embed="conv", skips="embed")
    assert stem.encoder.patch_embed is None and len(stem.encoder.conv_embed.stages) == 2  # tiny: patch 4
    assert plain.encoder.conv_embed is None and len(plain.project) == len(stem.project) == 1
    assert stem.encoder.skip_blocks == plain.encoder.skip_blocks == (0,)
    assert len(hybrid.project) == 0 and hybrid.encoder.skip_blocks == ()
    image = torch.randn(BATCH, 1, *plain.spec.default_patch_vox)
    for model in (plain, stem, hybrid):  # every parameter takes part: no skip is computed and left unused
        out = model.train()(image)
        assert out.shape == (BATCH, NUM_CLASSES, *plain.spec.default_patch_vox)
        out.square().mean().backward()
        unused = [key for key, param in model.named_parameters() if param.grad is None or not param.grad.any()]
        assert not unused, unused
    with pytest.raises(ValueError, match=r"skips='embed' .* needs embed='conv', got embed='patch'"):
        resolve_params(name, skips="embed")
    with pytest.raises(ValueError, match=r"embed must be one of patch, conv; got 'hybrid'"):
        resolve_params(name, embed="hybrid")
