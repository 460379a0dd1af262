"""The nnU-Net peer's conversions, both ways, on a tiny synthetic root (no nnU-Net needed): cellseg data → an nnU-Net
raw dataset whose supervision is cellseg's, and nnU-Net-shaped probabilities → a cellseg store at the crops'
geometry. The quick mode (`python -m bench.peers.nnunet --quick`) runs nnU-Net itself between the two."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tifffile

from bench.peers.nnunet import cases as case_io
from bench.peers.nnunet.cli import QUICK_CONFIG
from bench.peers.nnunet.env import find_env
from bench.peers.nnunet.labels import LabelScheme, class_masks, label_volume
from bench.peers.nnunet.probabilities import write_store
from cellseg.config import load_run_config
from cellseg.data.crops import crop_id
from cellseg.data.loader import open_crops
from cellseg.data.prediction_store import PredictionStore
from cellseg.data.split import read_datasplit


def test_scheme_regions_are_the_classes_atoms_and_ignore_is_highest() -> None:
    scheme = LabelScheme.of(["mito", "mito_mem", "er", "nuc"])
    labels = scheme.dataset_labels()
    assert labels["background"] == 0
    assert labels["ignore"] == len(scheme.atoms) + 1 == max(v for k, v in labels.items() if isinstance(v, int))
    assert labels["mito_mem"] == scheme.label_of("mito_mem")
    assert set(labels["mito"]) == {scheme.label_of(a) for a in ("mito_mem", "mito_lum", "mito_ribo")}
    assert set(labels["nuc"]) < set(range(1, scheme.ignore))
    order = scheme.regions_class_order()
    assert len(order) == len(scheme.classes) and all(o in scheme.region(c) for o, c in zip(order, scheme.classes, strict=True))


@pytest.mark.parametrize(("classes", "match"), [(["mito", "mito"], "more than once"),
                                                (["mitochondria_xyz"], "not a CellMap class"),
                                                ([], "at least one")])
def test_scheme_refuses_what_regions_cannot_express(classes: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LabelScheme.of(classes)


def test_label_volume_labels_only_voxels_every_atom_knows() -> None:
    target = np.zeros((3, 1, 1, 5), bool)
    known = np.ones((3, 1, 1, 5), bool)
    target[1, 0, 0, 1] = True  # atom 2 at x=1
    target[:2, 0, 0, 3] = True  # two atoms at x=3: inconsistent
    known[2, 0, 0, 4] = False  # atom 3 unknown at x=4
    assert label_volume(target, known)[0, 0].tolist() == [0, 2, 0, 4, 4]


@pytest.fixture(scope="module")
def converted(tiny_synth_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, object]:
    cfg = load_run_config(QUICK_CONFIG, [f"data.root={tiny_synth_root}"])
    raw = tmp_path_factory.mktemp("nnunet") / "raw"
    doc = case_io.convert(cfg, raw, progress=False)
    return raw / case_io.DATASET_NAME, doc, cfg


def test_conversion_teaches_exactly_cellseg_supervision(converted: tuple[Path, dict, object]) -> None:
    dataset, doc, cfg = converted
    scheme = LabelScheme.of(cfg.data.classes)
    meta = json.loads((dataset / "dataset.json").read_text())
    assert meta["labels"] == scheme.dataset_labels() and meta["file_ending"] == ".tif"
    train = [c for c in doc["cases"] if c["role"] == "train"]
    assert meta["numTraining"] == len(train) >= 1
    assert {c["role"] for c in doc["cases"]} == {"train", "tune", "test"}
    crops = sum(np.prod(c["crop_grid"]["shape_vox"]) for c in train)  # the labelled share of the cases' voxels
    assert doc["crop_share_of_cases"] == crops / sum(np.prod(c["grid"]["shape_vox"]) for c in train) < 1
    entries = [e for e in read_datasplit(dataset / "datasplit.csv") if e.split == "train"]
    crops = {c.name: c for c in open_crops(entries, cfg.data)}
    for record in train:
        case = case_io.Case.from_json(record)
        labels = tifffile.imread(dataset / "labelsTr" / f"{case.name}.tif")
        image = tifffile.imread(dataset / "imagesTr" / f"{case.name}_0000.tif")
        assert labels.shape == image.shape == tuple(case.grid.shape_vox) and labels.dtype == image.dtype == np.uint8
        spacing = json.loads((dataset / "labelsTr" / f"{case.name}.json").read_text())["spacing"]
        assert spacing == list(case.grid.voxel_size_nm) == list(cfg.data.voxel_size_nm)
        crop = crops[case.name]
        np.testing.assert_array_equal(image, case_io.read_em(crop, case.grid))
        target, known = crop.read_targets(case.grid, use_all=False)
        taught = labels != scheme.ignore
        assert taught.any() and not taught[known.sum(axis=0) == 0].any()  # never taught where cellseg knows nothing
        differ = 0
        for k, (name, mask) in enumerate(class_masks(labels, scheme).items()):
            assert known[k][taught].all(), name  # every class known wherever nnU-Net is taught
            if name in scheme.atoms:  # an atom is its own label: exactly cellseg's target
                np.testing.assert_array_equal(mask[taught], target[k][taught], err_msg=name)
            else:  # a group is the union of its atoms; its own array's pyramid may differ a little (cases.py)
                differ += int((mask[taught] != target[k][taught]).sum())
                assert (mask[taught] != target[k][taught]).mean() < 0.02, name
        assert differ == record["supervision"]["differing_pairs"]
        z, y, x = case.offset_vox
        inside = np.zeros(labels.shape, bool)
        dz, dy, dx = case.crop_grid.shape_vox
        inside[max(0, z - 1):z + dz + 1, max(0, y - 1):y + dy + 1, max(0, x - 1):x + dx + 1] = True
        assert (labels[~inside] == scheme.ignore).all()  # context: EM only (the crop grid is snapped to the EM lattice)
        assert 0 < record["supervision"]["kept_share"] <= 1
    with pytest.raises(FileExistsError, match="already there"):
        case_io.convert(cfg, dataset.parent, progress=False)


def _fake_nnunet_output(dataset: Path, doc: dict, out: Path, classes: list[str]) -> dict[str, np.ndarray]:
    """What `nnUNetv2_predict --save_probabilities` writes: `(R, z, y, x)` per case, here a known pattern."""
    out.mkdir(parents=True, exist_ok=True)
    made = {}
    for record in doc["cases"]:
        if record["role"] == "train":
            continue
        case = case_io.Case.from_json(record)
        assert (dataset / "imagesTs" / f"{case.name}_0000.tif").is_file()
        shape = tuple(case.grid.shape_vox)
        ramp = np.indices(shape).sum(axis=0) / max(1, sum(shape))
        probs = np.stack([(ramp + k / 10) % 1 for k in range(len(classes))]).astype(np.float32)
        np.savez_compressed(out / f"{case.name}.npz", probabilities=probs)
        made[case.name] = probs
    return made


def test_probabilities_come_back_at_the_crops_geometry(converted: tuple[Path, dict, object], tmp_path: Path) -> None:
    from cellseg.infer.crop_plan import box_grid
    from cellseg.infer.selection import select_targets

    dataset, doc, cfg = converted
    classes = doc["scheme"]["classes"]
    made = _fake_nnunet_output(dataset, doc, tmp_path / "pred", classes)
    cases = [case_io.Case.from_json(c) for c in doc["cases"] if c["role"] == "test"]
    store = write_store(tmp_path / "pred", cases, classes, tmp_path / "test.zarr",
                        provenance={"data_root": doc["data_root"]})
    assert store.kind == "probabilities" and store.completed() == sorted(c.name for c in cases)
    targets = {t.name: t for t in select_targets("test", cfg, dataset)}
    for case in cases:
        target = targets[case.name]
        assert store.grid(case.name) == box_grid(target.start_nm, target.stop_nm, target.em(), cfg.data.voxel_size_nm)
        held = store.crop_channels(case.name)
        assert set(held) == {c for c in classes if not target.labels or c in target.labels}
        z, y, x = case.offset_vox
        dz, dy, dx = case.crop_grid.shape_vox
        for name in held:
            expected = made[case.name][classes.index(name), z:z + dz, y:y + dy, x:x + dx]
            np.testing.assert_allclose(store.read(case.name, name), expected, atol=1e-3)  # float16 in the store
    again = write_store(tmp_path / "pred", cases, classes, tmp_path / "test.zarr", provenance={})
    assert again.completed() == store.completed()  # a re-run keeps what is written


def test_bad_probabilities_are_refused_with_the_file(converted: tuple[Path, dict, object], tmp_path: Path) -> None:
    dataset, doc, _ = converted
    classes = doc["scheme"]["classes"]
    made = _fake_nnunet_output(dataset, doc, tmp_path / "pred", classes)
    case = case_io.Case.from_json(next(c for c in doc["cases"] if c["role"] == "tune"))
    bad = made[case.name].copy()
    bad[(0, *case.offset_vox)] = np.nan  # the crop box's first voxel (the context around it is never stored)
    np.savez_compressed(tmp_path / "pred" / f"{case.name}.npz", probabilities=bad)
    with pytest.raises(ValueError, match=rf"{case.name}\.npz: 1 non-finite"):
        write_store(tmp_path / "pred", [case], classes, tmp_path / "tune.zarr", provenance={})
    np.savez_compressed(tmp_path / "pred" / f"{case.name}.npz", probabilities=bad[:, 1:])
    with pytest.raises(ValueError, match="expected"):
        write_store(tmp_path / "pred", [case], classes, tmp_path / "tune.zarr", provenance={})
    assert not (tmp_path / "tune.zarr" / case.name).exists()
    assert PredictionStore.open(tmp_path / "tune.zarr").completed() == []
    assert crop_id(case.name) > 0


def test_missing_environment_names_the_command(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"python -m bench\.peers\.nnunet env --env"):
        find_env(tmp_path / "nowhere")


def test_too_short_a_budget_is_refused_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from bench.peers.nnunet.cli import main

    assert main(["train", "--out", str(tmp_path / "peer"), "--budget-min", "0.5", "--env", str(tmp_path)]) == 2
    assert "shorter than one nnU-Net epoch" in capsys.readouterr().err
    assert not (tmp_path / "peer").exists()


def test_the_result_of_record_renders_with_its_numbers() -> None:
    from bench.peers.nnunet.tables import markdown

    record = json.loads((Path(__file__).resolve().parents[1] / "results" / "nnunet_peer_h200.json").read_text())
    text = markdown(record["scores"], {k: record[k] for k in ("nnunet_data", "nnunet_train", "nnunet_predict")})
    assert "| nnunet | plain | 0.2642 [0.1701, 0.4627] | 0.0629 [0.0531, 0.0738]" in text
    assert "patch [128, 128, 128], batch 2" in text and "673 iterations" in text
    assert text.count("\n| ") >= 2 + 48  # the arms table and one row per class


def test_an_arm_folder_made_from_other_stores_is_refused(tmp_path: Path) -> None:
    from bench.peers.nnunet.scoring import Arm, _arm_folder

    stores = [PredictionStore.create(tmp_path / f"{n}.zarr", kind="probabilities", channels=["mito"]).path
              for n in ("a_test", "a_tune", "b_test")]
    first = Arm("unet_3d", stores[0], stores[1])
    assert _arm_folder(first, tmp_path / "scores") == _arm_folder(first, tmp_path / "scores")  # reused
    with pytest.raises(ValueError, match="scored before from"):
        _arm_folder(Arm("unet_3d", stores[2], stores[1]), tmp_path / "scores")
