"""Slice figures on the tiny synthetic root: what is read, where it is drawn, and the errors users see."""

import numpy as np
import pytest
import zarr
from matplotlib.image import imread

from cellseg.data.prediction_store import PredictionStore
from cellseg.viz import (
    crop_figure,
    figure_size_px,
    group_figure,
    load_crop_slice,
    load_group_slice,
    load_prediction_slice,
    open_crop,
    prediction_figure,
    save_png,
)

PANEL = 96  # small panels keep the tests fast


def _label_array(root, dataset, crop, name, level="s0"):
    return zarr.open_array(str(root / dataset / f"{dataset}.zarr" / "recon-1" / "labels" / "groundtruth" / crop
                               / name / level), mode="r")[:]


def _overlay(ax):
    """The RGBA overlay drawn over the EM of an image panel."""
    images = ax.get_images()
    return np.asarray(images[1].get_array())


def _chromatic_pixels(png):
    rgb = imread(png)[..., :3]
    return int(((rgb.max(axis=-1) - rgb.min(axis=-1)) > 0.15).sum())


def test_slice_reads_the_arrays_on_their_own_grid(tiny_synth_root):
    s = load_crop_slice(tiny_synth_root, 1, classes=["mito", "er"], axis="z", index=5)
    mito = _label_array(tiny_synth_root, "synth-iso4-1", "crop1", "mito")
    assert s.plane.volume.voxel_size_nm == (4.0, 4.0, 4.0) and s.plane.num_slices == 32
    np.testing.assert_array_equal(s.ids["mito"], mito[5])
    np.testing.assert_array_equal(s.masks["mito"], mito[5] > 0)
    assert s.known["mito"].all() and "er" not in s.ids  # er is semantic: no ids
    assert s.em is not None and s.em.shape == (32, 32) and s.em.dtype == np.float32
    x_slice = load_crop_slice(tiny_synth_root, "crop1", classes=["mito"], axis="x", index=7)
    np.testing.assert_array_equal(x_slice.ids["mito"], mito[:, :, 7])
    assert x_slice.plane.image_axes == ("z", "y")


def test_default_is_the_middle_z_slice_of_every_annotated_class(tiny_synth_root):
    s = load_crop_slice(tiny_synth_root, 6)
    assert s.plane.axis == "z" and s.plane.index == 8
    assert set(s.classes) == set(open_crop(tiny_synth_root, 6).classes) >= {"mito", "nuc", "cell", "ecs"}


def test_other_voxel_sizes_and_anisotropic_crops(tiny_synth_root):
    coarse = load_crop_slice(tiny_synth_root, 1, classes=["mito"], voxel_size_nm=8)
    assert coarse.masks["mito"].shape == (16, 16) and coarse.plane.num_slices == 16
    s = load_crop_slice(tiny_synth_root, 3, classes=["er"], axis="y")  # synth-aniso-1: 5.24×4×4 nm
    assert s.plane.pixel_size_nm == (5.24, 4.0) and s.masks["er"].shape == (24, 32)
    left, right, bottom, top = s.plane.extent_nm
    assert right - left == pytest.approx(128.0) and bottom - top == pytest.approx(24 * 5.24)


def test_labels_coarser_than_the_em(tiny_synth_root):
    s = load_crop_slice(tiny_synth_root, 2, classes=["mito"], voxel_size_nm=4)  # labels at 8 nm, EM at 4 nm
    mito = _label_array(tiny_synth_root, "synth-iso4-1", "crop2", "mito")
    np.testing.assert_array_equal(s.ids["mito"], np.repeat(np.repeat(mito[s.plane.index // 2], 2, 0), 2, 1))
    assert np.isfinite(s.em).all()


def test_test_crops_come_from_ground_truth_zarr(tiny_synth_root):
    s = load_crop_slice(tiny_synth_root, 501, classes=["er", "mito"], axis="z", index=3)
    er = zarr.open_array(str(tiny_synth_root / "ground_truth.zarr" / "crop501" / "er"), mode="r")[:]
    np.testing.assert_array_equal(s.masks["er"], er[3] > 0)
    assert s.dataset == "synth-iso4-1" and s.em is not None


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"crop": 999}, r"crop 999 is not in .*training crops 1, 2, 3, 4, 5, 6, test crops 501, 502"),
    ({"crop": "cropX"}, "not a crop id"),
    ({"crop": 1, "classes": ["mitochondria"]}, "unknown CellMap class 'mitochondria'; did you mean mito"),
    ({"crop": 6, "classes": ["mito_mem"]}, r"crop6 \(synth-iso8-1\) does not annotate mito_mem"),
    ({"crop": 1, "index": 32}, r"crop1 \(synth-iso4-1\): slice index z=32 is out of range: 32 z slices at "
                               r"4×4×4 nm \(valid 0-31\)"),
    ({"crop": 1, "axis": "x", "index": -1}, "slice index x=-1 is out of range"),
    ({"crop": 1, "axis": "t"}, "axis 't' is not one of"),
    ({"crop": 1, "voxel_size_nm": "8,8"}, "give one or three positive numbers"),
])
def test_clear_errors(tiny_synth_root, kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_crop_slice(tiny_synth_root, **kwargs)


def test_not_a_data_root(tmp_path):
    with pytest.raises(FileNotFoundError, match="no training-crop manifest"):
        load_crop_slice(tmp_path, 1)


def test_crop_figure_png_size_overlay_and_reproducible_objects(tiny_synth_root, tmp_path):
    s = load_crop_slice(tiny_synth_root, 1, classes=["mito", "er", "cell"])
    fig = crop_figure(s, panel_px=PANEL, seed=1)
    out = save_png(fig, tmp_path / "crop.png")
    assert imread(out).shape[:2] == figure_size_px(fig)[::-1]
    classes_ax, objects_ax = fig.axes[1], fig.axes[2]
    union = s.masks["mito"] | s.masks["er"] | s.masks["cell"]
    assert ((_overlay(classes_ax)[..., 3] > 0) == union).all()  # class colour exactly where a label is
    objects = _overlay(objects_ax)
    assert ((objects[..., 3] > 0) == ((s.ids["mito"] > 0) | (s.ids["cell"] > 0))).all()
    np.testing.assert_array_equal(objects, _overlay(crop_figure(s, panel_px=PANEL, seed=1).axes[2]))
    assert not np.array_equal(objects, _overlay(crop_figure(s, panel_px=PANEL, seed=2).axes[2]))
    assert _chromatic_pixels(out) > 500
    scale_bar_labels = [t.get_text() for t in classes_ax.texts]
    assert scale_bar_labels == ["20 nm"]  # 128 nm wide panel: the 1-2-5 length under a fifth of it


def test_save_png_is_atomic_and_never_overwrites_silently(tiny_synth_root, tmp_path):
    fig = crop_figure(load_crop_slice(tiny_synth_root, 1, classes=["mito"]), panel_px=PANEL)
    out = save_png(fig, tmp_path / "a.png")
    with pytest.raises(FileExistsError, match="overwrite"):
        save_png(fig, out)
    save_png(fig, out, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["a.png"]  # no temporary left behind
    with pytest.raises(ValueError, match="PNG"):
        save_png(fig, tmp_path / "a.jpg")


def test_group_figure_against_its_atoms(tiny_synth_root, tmp_path):
    s = load_group_slice(tiny_synth_root, 1, "mito")
    assert s.classes == ("mito", "mito_mem", "mito_lum", "mito_ribo")
    np.testing.assert_array_equal(s.masks["mito"], s.masks["mito_mem"] | s.masks["mito_lum"] | s.masks["mito_ribo"])
    fig = group_figure(s, panel_px=160)
    titles = [ax.get_title().replace("\n", " ") for ax in fig.axes]
    assert "mito (group)" in titles and "atoms, mito outline: 0 px differ" in titles
    out = save_png(fig, tmp_path / "group.png")
    assert imread(out).shape[:2] == figure_size_px(fig)[::-1]
    with pytest.raises(ValueError, match="'mito_mem' is an atom, not a group class"):
        load_group_slice(tiny_synth_root, 1, "mito_mem")
    with pytest.raises(ValueError, match="annotates none of the atoms of mito"):
        load_group_slice(tiny_synth_root, 6, "mito")
    empty = load_group_slice(tiny_synth_root, 1, "mito", axis="y", index=3)  # no mitochondrion in this slice
    assert not any(m.any() for m in empty.masks.values())
    save_png(group_figure(empty, panel_px=PANEL), tmp_path / "empty.png")  # small and sparse: still lays out


@pytest.fixture(scope="module")
def stores(tiny_synth_root, tmp_path_factory):
    """A probability store (mito perfect, er with a false-positive block) and a segmentation store of crop1
    at 8 nm, written with the project's PredictionStore."""
    base = tmp_path_factory.mktemp("stores")
    view = open_crop(tiny_synth_root, 1)
    grid = view.grid((8.0, 8.0, 8.0))
    truth = {k: m for k, (m, _) in view.masks(grid, ["mito", "er"]).items()}
    er = truth["er"].astype(np.float32) * 0.9
    er[:, :4, :4] = 0.8  # false positives in one corner
    probs = PredictionStore.create(base / "probs.zarr", kind="probabilities", channels=["mito", "er"])
    probs.write_crop("crop1", grid, {"mito": truth["mito"].astype(np.float32), "er": er})
    seg = PredictionStore.create(base / "seg.zarr", kind="segmentation", channels=["mito", "er"],
                                 instance_channels=["mito"])
    seg.write_crop("crop1", grid, {"mito": view.ids(grid, "mito").astype(np.uint32), "er": truth["er"]})
    return base


def test_prediction_figure_shows_errors_where_they_are(tiny_synth_root, stores, tmp_path):
    p = load_prediction_slice(stores / "probs.zarr", 1, truth_root=tiny_synth_root, classes=["mito", "er"], index=2)
    assert p.plane.volume.voxel_size_nm == (8.0, 8.0, 8.0) and p.prediction["er"].dtype == np.float32
    fig = prediction_figure(p, panel_px=160)
    titles = [ax.get_title().replace("\n", " ") for ax in fig.axes]
    assert titles[3] == "FP 0 · FN 0 · IoU 1.00"  # mito: perfect
    fp = int((p.foreground("er") & ~p.truth.masks["er"]).sum())
    assert fp > 0 and titles[7].startswith(f"FP {fp} · FN 0")
    out = save_png(fig, tmp_path / "pred.png")
    assert imread(out).shape[:2] == figure_size_px(fig)[::-1]


def test_prediction_defaults_segmentation_and_no_truth(tiny_synth_root, stores, tmp_path):
    p = load_prediction_slice(stores / "seg.zarr", "crop1", truth_root=tiny_synth_root)
    assert set(p.classes) <= {"mito", "er"} and p.classes
    if "mito" in p.classes:
        assert p.has_ids("mito")
    alone = load_prediction_slice(stores / "seg.zarr", "crop1", axis="y")
    assert alone.truth is None
    fig = prediction_figure(alone, panel_px=PANEL)
    assert len(fig.axes) == len(alone.classes)  # one column: the prediction
    save_png(fig, tmp_path / "seg.png")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"crop": 7}, r"no crop crop7 \(crops: crop1\)"),
    ({"crop": 1, "classes": ["nuc"]}, "no channel for nuc"),
    ({"crop": 1, "index": 16}, "slice index z=16 is out of range: 16 z slices"),
    ({"crop": 1, "threshold": 1.5}, r"threshold 1.5 must be in \[0, 1\)"),
])
def test_prediction_errors(stores, kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_prediction_slice(stores / "probs.zarr", **kwargs)


def test_default_rows_include_missed_classes_and_are_capped(tiny_synth_root, tmp_path):
    view = open_crop(tiny_synth_root, 1)
    grid = view.grid((8.0, 8.0, 8.0))
    plane_index = grid.shape_vox[0] // 2
    names = [n for n in view.classes if view.masks(grid, [n])[n][0][plane_index].any()]
    assert len(names) > 8  # enough classes in view to need the cap
    truth = view.masks(grid, names)
    arrays = {n: np.zeros(grid.shape_vox, np.float32) for n in names}  # predicts nothing: all misses
    store = PredictionStore.create(tmp_path / "missed.zarr", kind="probabilities", channels=names)
    store.write_crop("crop1", grid, arrays)
    p = load_prediction_slice(tmp_path / "missed.zarr", 1, truth_root=tiny_synth_root)
    sizes = {n: int(truth[n][0][plane_index].sum()) for n in names}
    assert len(p.classes) == 8 and set(p.classes) == set(sorted(names, key=lambda n: -sizes[n])[:8])
    assert list(p.classes) == [n for n in names if n in p.classes]  # store order kept
    assert set(p.truth.masks) == set(p.classes)
