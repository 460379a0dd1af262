"""Colours and overlay layers: the class palette, seeded object colours, RGBA overlays."""

import numpy as np
import pytest
from matplotlib.colors import to_rgb

from cellseg.classes import all_classes
from cellseg.viz.overlay import error_counts, error_rgba, instance_rgba, outline, semantic_rgba, stack_rgba
from cellseg.viz.palette import CLASS_COLORS, ERROR_COLORS, class_color, instance_colors


def test_palette_covers_every_class_with_a_distinct_colour():
    names = {c.name for c in all_classes()}
    assert names == set(CLASS_COLORS), (names ^ set(CLASS_COLORS))
    rgb = {name: class_color(name) for name in names}
    assert len(set(rgb.values())) == len(names)
    for cls in all_classes():  # official aliases (chloroplast_mem ...) get the class's colour
        for alias in cls.aliases:
            assert class_color(alias) == rgb[cls.name]


def test_palette_rejects_unknown_classes():
    with pytest.raises(ValueError, match="unknown CellMap class 'mitochondrion'"):
        class_color("mitochondrion")


def test_instance_colours_are_distinct_reproducible_and_seeded():
    ids = np.arange(1, 501)
    colours = instance_colors(ids, seed=3)
    assert colours.shape == (500, 3) and colours.min() >= 0 and colours.max() <= 1
    assert len({tuple(np.round(c * 255).astype(int)) for c in colours}) == 500  # distinct even as 8-bit RGB
    np.testing.assert_array_equal(colours, instance_colors(ids, seed=3))
    assert not np.allclose(colours, instance_colors(ids, seed=4))
    # A colour depends on the id alone, not on the other ids in view: objects keep colours across slices.
    np.testing.assert_array_equal(instance_colors(np.array([7, 300]), seed=3), colours[[6, 299]])
    # Neighbouring ids (neighbouring objects after connected components) differ strongly in colour.
    assert np.abs(np.diff(colours, axis=0)).sum(axis=1).min() > 0.1


def test_instance_rgba_paints_objects_and_leaves_background_clear():
    ids = np.zeros((12, 12), np.uint32)
    ids[2:6, 2:6], ids[6:10, 6:10], ids[2:6, 6:10] = 5, 9, 12
    rgba = instance_rgba(ids, seed=0, outlines=False)
    assert (rgba[ids == 0, 3] == 0).all() and (rgba[ids != 0, 3] > 0).all()
    colours = {tuple(rgba[ids == i][0, :3]) for i in (5, 9, 12)}
    assert len(colours) == 3
    np.testing.assert_array_equal(rgba, instance_rgba(ids, seed=0, outlines=False))
    with_outlines = instance_rgba(ids, seed=0, outlines=True)
    assert (with_outlines[outline(ids), 3] == 1.0).all()
    with pytest.raises(ValueError, match="integers"):
        instance_rgba(ids.astype(np.float32))


def test_outline_marks_borders_and_touching_objects():
    ids = np.zeros((8, 8), np.uint16)
    ids[1:7, 1:4], ids[1:7, 4:7] = 1, 2
    edge = outline(ids)
    assert edge[1, 1] and edge[3, 3] and edge[3, 4]  # outer border and the line between 1 and 2
    assert not edge[3, 2] and not edge[0, 0]  # interior and background


def test_semantic_rgba_colours_exactly_the_mask_later_classes_on_top():
    mito = np.zeros((10, 10), bool)
    mito[2:8, 2:8] = True
    er = np.zeros((10, 10), bool)
    er[5:10, 5:10] = True
    rgba = semantic_rgba({"mito": mito, "er": er}, alpha=0.5)
    assert ((rgba[..., 3] > 0) == (mito | er)).all()
    np.testing.assert_allclose(rgba[3, 3, :3], to_rgb(CLASS_COLORS["mito"]))
    np.testing.assert_allclose(rgba[6, 6, :3], to_rgb(CLASS_COLORS["er"]))
    with pytest.raises(ValueError, match="differs"):
        semantic_rgba({"mito": mito, "er": er[:5]})


def test_error_map_and_counts():
    truth = np.zeros((6, 6), bool)
    truth[:, :3] = True
    pred = np.zeros((6, 6), bool)
    pred[:, 2:4] = True
    known = np.ones((6, 6), bool)
    known[5] = False
    rgba = error_rgba(truth, pred, known)
    np.testing.assert_allclose(rgba[0, 3, :3], to_rgb(ERROR_COLORS["fp"]))
    np.testing.assert_allclose(rgba[0, 0, :3], to_rgb(ERROR_COLORS["fn"]))
    np.testing.assert_allclose(rgba[5, 0, :3], to_rgb(ERROR_COLORS["unknown"]))
    assert rgba[0, 5, 3] == 0  # true negative: transparent
    assert error_counts(truth, pred, known) == {"tp": 5, "fp": 5, "fn": 10}


def test_stack_rgba_is_the_over_operator():
    bottom = np.zeros((1, 1, 4))
    bottom[..., :] = (1, 0, 0, 0.5)
    top = np.zeros((1, 1, 4))
    top[..., :] = (0, 0, 1, 0.5)
    out = stack_rgba([bottom, top])
    np.testing.assert_allclose(out[0, 0], (1 / 3, 0, 2 / 3, 0.75))
