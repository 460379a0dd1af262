"""Test-time augmentation: exact inverses, the transform sets per model, and exact averaging and blending."""

import itertools
import logging

import pytest
import torch
from windows import sliding_window

from cellseg.infer.tta import Transform, transforms, tta_predict

CASES = {  # name -> (spatial_dims, flip axes, transpose axes, expected count)
    "3d": (3, "zyx", "", 8),
    "3d_yx_transpose": (3, "yx", "yx", 8),
    "3d_yx": (3, "yx", "", 4),
    "3d_x": (3, "x", "", 2),
    "2d": (2, "yx", "yx", 8),
    "2d_no_transpose": (2, "yx", "", 4),
    "2d_from_3d_axes": (2, "zyx", "yx", 8),  # a 2D model's spec may list z: ignored
}


def _input(spatial_dims: int) -> torch.Tensor:
    shape = (2, 3, 4, 6, 6) if spatial_dims == 3 else (2, 3, 6, 6)
    return torch.rand(shape, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("case", CASES)
def test_invert_undoes_apply_exactly(case):
    dims, flips, swap, count = CASES[case]
    tfms = transforms(dims, tuple(flips), 8, transpose_axes=tuple(swap))
    assert len(tfms) == count
    x = _input(dims)
    outputs = []
    for t in tfms:
        y = t.apply(x)
        assert torch.equal(t.invert(y), x), t.name
        outputs.append(y)
    assert tfms[0].name == "identity" and torch.equal(outputs[0], x)
    # Distinct transforms: no two give the same result on a random input.
    for (a, ya), (b, yb) in itertools.combinations(zip(tfms, outputs, strict=True), 2):
        assert not torch.equal(ya, yb), (a.name, b.name)


def test_the_standard_sets():
    assert [t.name for t in transforms(3, ("z", "y", "x"))] == [
        "identity", "flip_z", "flip_y", "flip_x", "flip_zy", "flip_zx", "flip_yx", "flip_zyx"]
    names_2d = [t.name for t in transforms(2, ("y", "x"), transpose_axes=("y", "x"))]
    assert names_2d[:4] == ["identity", "flip_y", "flip_x", "flip_yx"]
    assert all(n.endswith("transpose_yx") for n in names_2d[4:])
    assert [t.name for t in transforms(3, ("x", "z", "y"), 1)] == ["identity"]


def test_flip_and_transpose_do_what_they_say():
    x = torch.arange(2 * 3, dtype=torch.float32).reshape(1, 1, 2, 3)
    assert torch.equal(Transform(axes="yx", flip_axes=("x",)).apply(x), x.flip(-1))
    assert torch.equal(Transform(axes="yx", transpose_yx=True).apply(x), x.transpose(-1, -2))
    t = Transform(axes="yx", flip_axes=("y",), transpose_yx=True)
    assert torch.equal(t.apply(x), x.flip(-2).transpose(-1, -2))
    # Outputs of a transposed (non-square) input come back to the input's shape.
    assert t.invert(t.apply(x)).shape == x.shape


def test_fewer_transforms_than_asked_are_logged(caplog):
    with caplog.at_level(logging.INFO, logger="cellseg.infer.tta"):
        tfms = transforms(3, ("y", "x"), 8)
    assert len(tfms) == 4
    assert "only 4 distinct transforms" in caplog.text


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="spatial_dims"):
        transforms(4, ("z",))
    with pytest.raises(ValueError, match="at least 1"):
        transforms(3, ("z",), 0)
    with pytest.raises(ValueError, match="not among the spatial axes"):
        Transform(axes="yx", flip_axes=("z",))
    with pytest.raises(ValueError, match=r"\(B, C, Z, Y, X\)"):
        Transform(axes="zyx", flip_axes=("z",)).apply(torch.zeros(1, 1, 4, 4))
    with pytest.raises(ValueError, match="at least one transform"):
        tta_predict(torch.sigmoid, torch.zeros(1, 1, 2, 2), [])


@pytest.mark.parametrize("case", ["3d", "2d", "3d_yx"])
def test_identity_model_tta_equals_one_pass(case):
    dims, flips, swap, _ = CASES[case]
    x = _input(dims)
    single = tta_predict(lambda b: b.clone(), x, transforms(dims, tuple(flips), 1))
    averaged = tta_predict(lambda b: b.clone(), x, transforms(dims, tuple(flips), 8, transpose_axes=tuple(swap)))
    assert torch.equal(single, x)
    assert torch.equal(averaged, single)  # bit for bit: pairwise sums of equal values are exact


def test_model_returning_its_input_is_not_corrupted_in_place():
    x = _input(3)
    keep = x.clone()
    out = tta_predict(lambda b: b, x, transforms(3, "zyx"))  # the output aliases the input for the identity
    assert torch.equal(x, keep) and torch.equal(out, keep)


def test_equivariant_model_gives_the_same_with_tta_8_as_1():
    x = _input(3) * 8 - 4
    tfms = transforms(3, ("z", "y", "x"))
    assert torch.equal(tta_predict(torch.sigmoid, x, tfms), tta_predict(torch.sigmoid, x, tfms[:1]))


def test_non_equivariant_model_is_averaged_over_the_inverted_outputs():
    x = _input(2)
    ramp = torch.linspace(0, 1, x.shape[-1])

    def model(b):  # position-dependent: not flip-equivariant
        return b * ramp

    tfms = transforms(2, ("y", "x"), transpose_axes=("y", "x"))
    expected = torch.stack([t.invert(model(t.apply(x))) for t in tfms]).mean(0)
    got = tta_predict(model, x, tfms)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(got, model(x))


@pytest.mark.parametrize("dims", [2, 3])
def test_folded_passes_equal_one_pass_at_a_time(dims):
    # `fold` transforms share one call of the model: same sums in the same order, so bit for bit the same
    x = _input(dims)
    ramp = torch.linspace(-1, 2, x.shape[-1])
    calls: list[int] = []

    def model(b):  # position-dependent (not equivariant), and each tile's output depends on that tile only
        calls.append(b.shape[0])
        return torch.sigmoid(b * ramp + b.roll(1, -2))

    axes = ("z", "y", "x") if dims == 3 else ("y", "x")
    tfms = transforms(dims, axes, 8, transpose_axes=() if dims == 3 else ("y", "x"))
    one = tta_predict(model, x, tfms)
    for fold in (2, 4, 8):
        calls.clear()
        assert torch.equal(tta_predict(model, x, tfms, fold=fold), one), fold
        assert calls == [fold * x.shape[0]] * (8 // fold)
    with pytest.raises(ValueError, match="fold"):
        tta_predict(model, x, tfms, fold=0)


@pytest.mark.parametrize("blend", ["gaussian", "constant"])
@pytest.mark.parametrize("value", [0.0, 0.3, 0.71875, 1.0])
def test_blending_a_constant_returns_it_exactly(blend, value):
    image = torch.full((1, 23, 37, 30), value)  # odd sizes: tiles overlap unevenly, last tiles flush
    tfms = transforms(3, ("z", "y", "x"))
    out = sliding_window(lambda b: tta_predict(lambda t: t.clone(), b, tfms), image, patch_vox=(8, 16, 16),
                         num_outputs=1, overlap=0.5, batch_size=3, blend=blend)
    expected = torch.tensor(value).half().float()  # tile outputs are float16 before blending
    assert out.shape == image.shape
    assert torch.equal(out, torch.full_like(out, float(expected)))


def test_blending_a_constant_2d_returns_it_exactly():
    image = torch.full((1, 5, 21, 19), 0.5)
    tfms = transforms(2, ("y", "x"), transpose_axes=("y", "x"))
    out = sliding_window(lambda b: tta_predict(torch.clone, b, tfms), image, patch_vox=(1, 8, 8), num_outputs=1,
                         overlap=0.25, batch_size=7)
    assert torch.equal(out, torch.full_like(out, 0.5))
