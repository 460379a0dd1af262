"""The class catalogue against the official tables (the CSC class tables packaged in `cellseg/manifests/`)."""

import pytest

from cellseg import classes as C


def test_counts():
    assert len(C.all_classes()) == 77  # 74 CellMap ids + 3 yolk ids
    assert [c.id for c in C.all_classes()] == list(range(1, 78))
    assert len(C.tested_classes()) == 48
    assert len(C.semantic_classes()) == 38


def test_the_ten_instance_classes():
    assert set(C.instance_classes()) == {"nuc", "ves", "endo", "lyso", "ld", "perox", "mito", "np", "mt", "cell"}
    assert not C.get_class("vim").instance  # listed in INSTANCE_CLASSES officially but never tested


def test_group_is_union_of_its_members_atoms():
    for cls in C.all_classes():
        if cls.is_group:
            union = frozenset().union(*(C.get_class(m).atom_ids for m in C.members_of(cls.name)))
            assert cls.atom_ids == union, cls.name
        else:
            assert cls.atom_ids == {cls.id}


@pytest.mark.parametrize(("group", "atoms"), [
    ("mito", ("mito_mem", "mito_lum", "mito_ribo")),
    ("np", ("np_out", "np_in")),
    ("mt", ("mt_out", "mt_in")),
    ("er", ("er_mem", "er_lum", "eres_mem", "eres_lum", "ne_mem", "ne_lum", "np_out", "np_in")),
    ("er_mem_all", ("er_mem", "eres_mem", "ne_mem")),
    ("nuc", ("ne_mem", "ne_lum", "np_out", "np_in", "hchrom", "nhchrom", "echrom", "nechrom", "nucpl", "nucleo")),
])
def test_named_groups(group, atoms):
    assert C.atoms_of(group) == atoms


def test_cell_excludes_ecs_rbc_bm():
    cell = set(C.atoms_of("cell"))
    assert {"pm", "cyto", "mito_lum", "vim", "glyco", "actin", "tbar"} <= cell
    assert not {"ecs", "rbc", "bm"} & cell


def test_mutual_exclusion_from_disjoint_atoms():
    assert C.mutually_exclusive("mito", "nuc")
    assert C.mutually_exclusive("ecs", "cell")
    assert not C.mutually_exclusive("er", "ne")  # ne is part of er
    assert not C.mutually_exclusive("er_mem_all", "ne_mem_all")  # share ne_mem
    assert not C.mutually_exclusive("mito_mem", "mito")
    names = ["mito", "mito_mem", "nuc", "ecs"]
    ex = {a: [b for b in names if b != a and C.mutually_exclusive(a, b)] for a in names}
    assert set(ex["mito"]) == {"nuc", "ecs"}
    assert "mito" not in ex["mito_mem"]
    for a, others in ex.items():  # symmetric
        for b in others:
            assert a in ex[b]


def test_lookup_by_alias_and_id():
    assert C.get_class("chloroplast_mem").name == "chlor_mem"
    assert C.get_class(50).name == "mito"
    assert C.get_class("mito").metric == "instance"
    assert C.get_class("er").metric == "semantic"
    assert C.get_class("ribo").metric is None


def test_unknown_class_names_close_matches():
    with pytest.raises(ValueError, match="did you mean mito"):
        C.get_class("mitochondria_x")
    with pytest.raises(ValueError, match="1-77"):
        C.get_class(99)
