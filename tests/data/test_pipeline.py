"""The training pipeline end to end on a crafted root whose EM intensity encodes the labels."""

import pickle

import numpy as np
import pytest
import torch
from crafted import write_root

from cellseg.config.schema import AugmentConfig, DataConfig, LoaderConfig
from cellseg.data.loader import build_train_data, read_train_crops
from cellseg.data.sampling import ForegroundIndex
from cellseg.data.split import read_datasplit
from cellseg.data.target_bits import unpack_bits

NO_INTENSITY = dict(
    intensity_p=0.0, noise_p=0.0, blur_p=0.0, missing_section_p=0.0, dim_section_p=0.0, misalign_p=0.0
)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_root(tmp_path_factory.mktemp("crafted"), black_slab=False)


def _data(root, **kw):
    base = dict(
        root=str(root),
        classes=("mito", "ecs", "golgi"),
        voxel_size_nm=(8.0, 8.0, 8.0),
        patch_shape_vox=(8, 8, 8),
        validation_fraction=0.5,
    )
    return DataConfig(**{**base, **kw})


def _batch(td, n=4):
    return torch.utils.data.default_collate([td.dataset[i] for i in range(n)])


def test_bit_packing_round_trip():
    rng = np.random.default_rng(0)
    mask = rng.random((13, 3, 4, 5)) > 0.5
    bits = np.packbits(mask, axis=0, bitorder="little")  # the packing `cellseg.data.dataset` documents
    assert bits.shape == (2, 3, 4, 5) and bits.dtype == np.uint8
    np.testing.assert_array_equal(unpack_bits(bits, 13), mask)


@pytest.mark.parametrize("rotate_p", [0.0, 1.0])
def test_labels_stay_aligned_with_em_after_spatial_augmentation(root, rotate_p, tmp_path):
    aug = AugmentConfig(flip_p=0.5, transpose=True, rotate_p=rotate_p, **NO_INTENSITY)
    td = build_train_data(
        _data(root, validation_fraction=0.5),
        LoaderConfig(num_workers=0),
        aug,
        batch_size=4,
        seed=3,
        run_dir=tmp_path,
    )
    assert (tmp_path / "datasplit.csv").is_file() and read_datasplit(tmp_path / "datasplit.csv")
    for step in range(3):
        image, target, known = td.augment(_batch(td), step)
        # 3 classes + the boundary channel of mito (instance-scored)
        assert image.shape == (4, 1, 8, 8, 8) and target.shape == known.shape == (4, 4, 8, 8, 8)
        bright = image[:, 0] > 130 / 255  # EM is 200 on mito, 60 on ecs
        sure = known[:, 0] & known[:, 1]
        agree = (bright == target[:, 0])[sure].float().mean().item()
        if rotate_p == 0:
            assert agree == 1.0  # flips/transposes are exact permutations
        else:
            assert agree > 0.9  # bilinear image vs nearest labels differ only at block edges
        assert ((target[:, 0] ^ target[:, 1]) | ~sure).all()  # mito and ecs partition the annotated crop


def test_2d_patches_and_slicing_axes(root):
    data = _data(root, patch_shape_vox=(1, 16, 16), slice_axes=("z", "y", "x"))
    td = build_train_data(
        data, LoaderConfig(num_workers=0), AugmentConfig(**NO_INTENSITY), batch_size=2, seed=0
    )
    image, target, _ = td.augment(_batch(td, 6), 0)
    assert image.shape == (6, 1, 16, 16) and target.shape == (6, 4, 16, 16)
    axes = {td.dataset.sampler(i).slice_axis for i in range(30)}
    assert axes == {0, 1, 2}


def test_samples_reproducible_and_distinct_per_rank(root):
    def build(rank, world, batch, seed=1):
        return build_train_data(_data(root), LoaderConfig(num_workers=0, samples_per_epoch=8), AugmentConfig(),
                                batch_size=batch, seed=seed, rank=rank, world_size=world)

    r0, r1 = build(0, 2, 1), build(1, 2, 1)
    i0, i1 = list(r0.sampler), list(r1.sampler)
    assert not set(i0) & set(i1) and len(i0) == len(i1) == 4
    single = list(build(0, 1, 2).sampler)
    assert sorted(i0 + i1) == single  # 2 ranks x batch 1 see exactly what 1 rank x batch 2 sees
    assert [r0.dataset.sampler(i) for i in i0] == [build(0, 2, 1).dataset.sampler(i) for i in i0]
    assert [r0.dataset.sampler(i) for i in i0] != [build(0, 2, 1, seed=2).dataset.sampler(i) for i in i0]
    r0.sampler.set_epoch(1, start_batch=2)
    assert list(r0.sampler) == [8 + 2 * 2 + 0, 8 + 3 * 2 + 0]


def test_class_balanced_sampler_visits_every_class(root):
    td = build_train_data(
        _data(root, classes=("mito", "ecs")),
        LoaderConfig(num_workers=0),
        AugmentConfig(),
        batch_size=2,
        seed=0,
    )
    sampler = td.dataset.sampler
    assert sorted(sampler.classes) == [0, 1]
    crops = [sampler(i).crop for i in range(40)]
    assert len(set(crops)) >= 1


def test_crop_smaller_than_patch_pads_unknown(root):
    # 32^3 patches at 8 nm are larger than crop 2 (16^3): targets outside the crop are unknown.
    data = _data(root, classes=("ecs",), patch_shape_vox=(32, 32, 32), validation_fraction=0.5)
    td = build_train_data(
        data, LoaderConfig(num_workers=0), AugmentConfig(enabled=False), batch_size=2, seed=0
    )
    _, _, known = td.augment(_batch(td, 2), 0)
    assert known.shape == (2, 1, 32, 32, 32)
    assert 0 < known.float().mean() < 1


def test_anisotropic_grid_and_coarser_level(root):
    # 16 x 8 x 8 nm needs EM s2 (16 nm) along z and s1 (8 nm) in-plane: resampled from s1 with area weights.
    data = _data(root, voxel_size_nm=(16.0, 8.0, 8.0), patch_shape_vox=(4, 8, 8))
    td = build_train_data(
        data, LoaderConfig(num_workers=0), AugmentConfig(**NO_INTENSITY), batch_size=2, seed=0
    )
    assert td.augment.tilt is False and td.augment.swappable == [(1, 2)]
    image, _, _ = td.augment(_batch(td, 2), 0)
    assert image.shape == (2, 1, 4, 8, 8)
    # Reading at 32 nm needs a coarser level than the labels' 8 nm s0.
    coarse = _data(
        root, voxel_size_nm=(32.0, 32.0, 32.0), patch_shape_vox=(4, 4, 4), max_annotation_voxel_size_nm=8.0
    )
    td = build_train_data(
        coarse, LoaderConfig(num_workers=0), AugmentConfig(enabled=False), batch_size=2, seed=0
    )
    assert td.augment(_batch(td, 2), 0)[0].shape == (2, 1, 4, 4, 4)


def test_black_em_is_unknown(tmp_path):
    root = write_root(tmp_path, black_slab=True)
    td = build_train_data(
        _data(root, patch_shape_vox=(24, 24, 24)),
        LoaderConfig(num_workers=0),
        AugmentConfig(enabled=False),
        batch_size=2,
        seed=0,
    )
    batch = _batch(td, 4)
    _, _, known = td.augment(batch, 0)
    black = batch["image"][:, 0] == 0
    assert black.any()
    assert not known.permute(1, 0, 2, 3, 4)[:, black].any()


def test_unknown_class_names_and_empty_selection(root):
    with pytest.raises(ValueError, match="unknown CellMap class 'mitocondria'"):
        _data(root, classes=("mitocondria",))
    with pytest.raises(ValueError, match=r"no training crop annotates any of \['ld'\]"):
        build_train_data(
            _data(root, classes=("ld",)), LoaderConfig(num_workers=0), AugmentConfig(), batch_size=2, seed=0
        )


def test_workers_give_the_same_samples(root):
    data = _data(root, resident="off")  # the streaming loader's workers (resident batches have none)
    loader0 = build_train_data(
        data, LoaderConfig(num_workers=0, samples_per_epoch=4), AugmentConfig(), batch_size=2, seed=5
    ).loader
    loader2 = build_train_data(
        data,
        LoaderConfig(num_workers=2, samples_per_epoch=4, persistent_workers=False),
        AugmentConfig(),
        batch_size=2,
        seed=5,
    ).loader
    for a, b in zip(loader0, loader2, strict=True):
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["target_bits"], b["target_bits"])


def test_ids_and_bits_encodings_give_the_same_targets(tmp_path):
    """Targets looked up on the GPU from `all` ids equal the bit-packed per-array targets."""
    root = write_root(tmp_path, black_slab=True)
    aug = AugmentConfig(rotate_p=0.5, **NO_INTENSITY)
    td = build_train_data(_data(root, patch_shape_vox=(16, 16, 16)), LoaderConfig(num_workers=0), aug,
                          batch_size=4, seed=4)
    assert td.dataset.target_mode == "ids"
    ids_batch = _batch(td, 4)
    assert ids_batch["ids"].dtype == torch.uint8 and ids_batch["target_bits"].shape[1] == 1  # 1 boundary channel
    td.dataset.use_all = False
    assert td.dataset.target_mode == "bits"
    bits_batch = _batch(td, 4)
    for a, b in zip(td.augment(ids_batch, 7), td.augment(bits_batch, 7), strict=True):
        assert torch.equal(a, b)


def test_crops_read_ahead_give_the_same_batches_and_write_nothing(root, tmp_path):
    """`cellseg.train.setup` reads the crops in a thread beside the GPU probe (`read_train_crops`), then builds
    the batches from them: the same batches as reading inside `build_train_data`; the run directory receives the
    split only from `build_train_data` (the lock is held by then)."""
    data, loader = _data(root), LoaderConfig(num_workers=0, samples_per_epoch=8)
    augment = AugmentConfig(rotate_p=0.5, **NO_INTENSITY)
    run = tmp_path / "run"
    run.mkdir()
    crops = read_train_crops(data, loader, augment, seed=1, warm_caches=True)
    assert not any(run.iterdir())
    ahead = build_train_data(data, loader, augment, batch_size=2, seed=1, run_dir=run, crops=crops)
    inside = build_train_data(data, loader, augment, batch_size=2, seed=1)
    assert (run / "datasplit.csv").is_file() and read_datasplit(run / "datasplit.csv") == inside.split
    assert [c.name for c in ahead.train_crops] == [c.name for c in inside.train_crops]
    for a, b in zip(_batch(ahead).values(), _batch(inside).values(), strict=True):
        assert torch.equal(a, b) if torch.is_tensor(a) else a == b


def test_foreground_index_keeps_every_run_in_one_tensor():
    rng = np.random.default_rng(0)
    points = [[rng.random((n, 3)) for n in counts] for counts in ([3, 0, 2], [0, 0, 5], [1, 1, 0])]
    index = ForegroundIndex(points)
    assert index.coords.shape == (12, 3) and index.bounds.tolist() == [[0, 3, 3, 5], [5, 5, 5, 10], [10, 11, 12, 12]]
    for c, per_class in enumerate(points):
        for k, p in enumerate(per_class):
            np.testing.assert_array_equal(index.of(c, k), p)
    assert [index.crops_with(k).tolist() for k in range(3)] == [[0, 2], [2], [0, 1]]
    assert ForegroundIndex([]).num_crops == 0 and ForegroundIndex([[], []]).bounds.tolist() == [[0], [0]]


def test_streaming_workers_receive_a_small_payload(root):
    """The streaming dataset reaches a spawned worker as shared memory (its bytes and its sampling rule): a
    payload beyond a pipe's buffer would start the workers one after another (`PatchDataset.__reduce__`)."""
    from multiprocessing.reduction import ForkingPickler

    td = build_train_data(_data(root, resident="off"), LoaderConfig(num_workers=0, samples_per_epoch=8),
                          AugmentConfig(rotate_p=0.5, **NO_INTENSITY), batch_size=2, seed=1)
    payload = ForkingPickler.dumps(td.dataset)  # what the DataLoader's spawn context sends each worker
    assert len(payload) < 16 * 1024
    clone = pickle.loads(payload)
    assert len(clone) == len(td.dataset) and [c.name for c in clone.crops] == [c.name for c in td.dataset.crops]
    for i in range(4):
        for key, value in clone[i].items():
            expected = td.dataset[i][key]
            assert torch.equal(value, expected) if torch.is_tensor(value) else value == expected
