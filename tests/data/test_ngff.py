"""OME-NGFF 0.4 multiscale metadata: parsing, validation, pyramid convention."""

import pytest

from cellseg.data.ngff import AXES, build_multiscales, parse_multiscales, pyramid_levels


def _attrs(axes=None, datasets=None, **extra):
    axes = axes if axes is not None else [{"name": a, "type": "space", "unit": "nanometer"} for a in AXES]
    datasets = datasets if datasets is not None else [
        {"path": "s0", "coordinateTransformations": [{"type": "scale", "scale": [8, 8, 8]},
                                                     {"type": "translation", "translation": [4, 4, 4]}]}]
    return {"multiscales": [{"version": "0.4", "axes": axes, "datasets": datasets, **extra}]}


def test_pyramid_follows_voxel_centre_convention():
    # Real crop 982: 16 nm level of a 4 nm s0 at origin 0 has translation (4 - 1) * 4 / 2 = 6.
    levels = pyramid_levels((4, 4, 4), (0, 0, 0), 3)
    assert [lv.voxel_size_nm for lv in levels] == [(4, 4, 4), (8, 8, 8), (16, 16, 16)]
    assert levels[2].translation_nm == (6, 6, 6)
    # Anisotropic s0 (hela-2 style, 2.62 x 2 x 2 nm).
    aniso = pyramid_levels((2.62, 2, 2), (10, 0, 0), 2)
    assert aniso[1].voxel_size_nm == (5.24, 4, 4)
    assert aniso[1].translation_nm == pytest.approx((11.31, 1, 1))


def test_build_then_parse_round_trip():
    levels = pyramid_levels((2, 4, 4), (1, 2, 3), 4)
    assert parse_multiscales(build_multiscales(levels, name="mito"), source="x") == levels


def test_levels_sorted_finest_first_and_units_converted():
    datasets = [
        {"path": "s1", "coordinateTransformations": [{"type": "scale", "scale": [0.016, 0.016, 0.016]}]},
        {"path": "s0", "coordinateTransformations": [{"type": "scale", "scale": [0.008, 0.008, 0.008]},
                                                     {"type": "translation", "translation": [0.1, 0, 0]}]},
    ]
    axes = [{"name": a, "type": "space", "unit": "micrometer"} for a in AXES]
    levels = parse_multiscales(_attrs(axes=axes, datasets=datasets), source="x")
    assert [lv.path for lv in levels] == ["s0", "s1"]
    assert levels[0].voxel_size_nm == pytest.approx((8, 8, 8))
    assert levels[0].translation_nm == pytest.approx((100, 0, 0))


def test_multiscale_wide_transformation_applies_after_levels():
    attrs = _attrs(coordinateTransformations=[{"type": "scale", "scale": [2, 2, 2]},
                                              {"type": "translation", "translation": [1, 1, 1]}])
    (level,) = parse_multiscales(attrs, source="x")
    assert level.voxel_size_nm == (16, 16, 16)
    assert level.translation_nm == (9, 9, 9)


@pytest.mark.parametrize(("attrs", "message"), [
    ({}, "no OME-NGFF 'multiscales'"),
    (None, "no OME-NGFF 'multiscales'"),
    (_attrs(axes=[{"name": a, "type": "space", "unit": "nanometer"} for a in "xyz"]), r"axes are \['x', 'y', 'z'\]"),
    (_attrs(axes=[{"name": "c", "type": "channel"}] + [{"name": a, "type": "space"} for a in AXES]), "3D volumes"),
    (_attrs(axes=[{"name": a, "type": "space", "unit": "second"} for a in AXES]), "unit 'second'"),
    (_attrs(datasets=[]), "lists no datasets"),
    (_attrs(datasets=[{"path": "s0", "coordinateTransformations": [{"type": "scale", "scale": [8, 8]}]}]),
     "must have 3 values"),
    (_attrs(datasets=[{"path": "s0", "coordinateTransformations": [{"type": "affine"}]}]), "unsupported"),
    (_attrs(datasets=[{"path": "s0", "coordinateTransformations": [{"type": "scale", "scale": [0, 8, 8]}]}]),
     "must be positive"),
])
def test_bad_metadata_names_the_source(attrs, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_multiscales(attrs, source="/data/ds.zarr/recon-1/em")
    assert "/data/ds.zarr/recon-1/em" in str(info.value)
