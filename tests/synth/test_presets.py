"""The `quality` preset (bench/studies/quality): `medium`'s datasets and EM with crops for an 8 nm ensemble."""

from cellseg.synth.presets import MEDIUM, get_preset


def test_quality_preset_keeps_medium_em_and_tests_at_several_voxel_sizes() -> None:
    quality = get_preset("quality")
    assert [(d.name, d.voxel_size_nm, d.shape_vox) for d in quality.datasets] == \
        [(d.name, d.voxel_size_nm, d.shape_vox) for d in MEDIUM.datasets]  # the same rendering cost
    assert quality.style == MEDIUM.style and quality.num_em_voxels == MEDIUM.num_em_voxels
    crops = [(d, c) for d in quality.datasets for c in d.crops]
    train = [c for _, c in crops if c.role == "train"]
    tests = [(d, c) for d, c in crops if c.role == "test"]
    assert len(train) == 24 and len(tests) == 8
    assert all(c.scale in (1, 2) for _, c in crops)  # nothing an 8 nm model cannot use as coarse as 16-32 nm
    test_voxels = {tuple(v * c.scale for v in d.voxel_size_nm) for d, c in tests}
    assert test_voxels == {(4.0, 4.0, 4.0), (8.0, 8.0, 8.0), (5.24, 4.0, 4.0), (10.48, 8.0, 8.0), (16.0, 16.0, 16.0)}
    assert {c.classes for d, c in tests if max(d.voxel_size_nm) * c.scale > 8} == {"coarse"}
