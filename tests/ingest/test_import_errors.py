"""`cellseg import` refuses bad inputs with one clear line naming the file or option, never clobbers a root it
did not write, and leaves nothing behind when it fails."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cellseg.cli import main
from cellseg.ingest.importer import ImportOptions, import_volume
from cellseg.ingest.labels import parse_class_map


def _error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 2
    return capsys.readouterr().err


def test_voxel_size_needs_three_values(tmp_path, import_args, inputs, capsys) -> None:
    args = import_args(tmp_path / "root")
    args[args.index("--voxel-size") + 1] = "5,5"
    assert "--voxel-size needs 3 positive values (z, y, x in nm), got 2: 5,5" in _error(args, capsys)
    with pytest.raises(ValueError, match="--voxel-size needs 3 positive values"):
        ImportOptions(em=inputs["em"], out=tmp_path / "x", voxel_size_nm=(40, 5, 0))
    assert not (tmp_path / "root").exists()


def test_label_shape_mismatch_names_the_file(tmp_path, inputs, arrays, capsys) -> None:
    np.save(tmp_path / "short.npy", arrays["er"][:, :, :95])
    err = _error(["import", inputs["em"], "--voxel-size", "40,5,5", "--out", str(tmp_path / "root"),
                  "--label", f"er={tmp_path / 'short.npy'}"], capsys)
    assert f"{tmp_path / 'short.npy'}: label shape (24, 96, 95) (z, y, x) differs from the EM's (24, 96, 96)" in err
    err = _error(["import", inputs["em"], "--voxel-size", "40,5,5", "--out", str(tmp_path / "root"),
                  "--label", f"mito={inputs['mito']}", "--label", f"er={tmp_path / 'short.npy'}"], capsys)
    assert f"{tmp_path / 'short.npy'}: label shape (24, 96, 95)" in err
    err = _error(["import", inputs["em"], "--voxel-size", "40,5,5", "--out", str(tmp_path / "root"),
                  "--label", f"er={tmp_path / 'short.npy'}", "--labels-offset", "0,0,100"], capsys)
    assert "lies (partly) outside the EM" in err and "short.npy" in err


def test_a_zero_labels_offset_is_taken_as_given(tmp_path, inputs, arrays, capsys) -> None:
    """`--labels-offset 0,0,0` places labels of a sub-region at the EM's corner (not "offset not given")."""
    np.save(tmp_path / "corner.npy", arrays["er"][:, :, :48])
    args = ["import", inputs["em"], "--voxel-size", "40,5,5", "--out", str(tmp_path / "root"),
            "--label", f"er={tmp_path / 'corner.npy'}", "--gap-nm", "80", "--crop-nm", "200"]
    assert "differs from the EM's" in _error(args, capsys)  # no offset given: the EM's shape is expected
    assert main([*args, "--labels-offset", "0,0,0"]) == 0
    for zattrs in (tmp_path / "root").rglob("groundtruth/crop*/er/.zattrs"):  # every crop at the EM's corner in y, x
        transform = json.loads(zattrs.read_text())["multiscales"][0]["datasets"][0]["coordinateTransformations"]
        assert transform[1]["translation"][1:] == [0.0, 0.0], zattrs  # the EM's voxel (0, 0, 0) is centred at 0
        assert json.loads((zattrs.parent / "s0" / ".zarray").read_text())["shape"][1:] == [96, 48]


def test_unknown_class_names(tmp_path, inputs, capsys) -> None:
    err = _error(["import", inputs["em"], "--voxel-size", "40,5,5", "--out", str(tmp_path / "root"),
                  "--label", f"mitox={inputs['mito']}"], capsys)
    assert f"--label mitox={inputs['mito']}: unknown CellMap class 'mitox'; did you mean mito" in err
    with pytest.raises(ValueError, match=r"--class-map '1=mito,2=golgi_apparatus': unknown CellMap class"):
        parse_class_map("1=mito,2=golgi_apparatus")
    (tmp_path / "map.json").write_text(json.dumps({"1": "mito", "2": "nope"}))
    with pytest.raises(ValueError, match=r"map.json: unknown CellMap class 'nope'"):
        parse_class_map(str(tmp_path / "map.json"))
    with pytest.raises(ValueError, match="must be >= 1"):
        parse_class_map("0=mito")


def test_unmapped_values_and_fractional_labels(tmp_path, inputs, arrays, capsys) -> None:
    err = _error(["import", inputs["em"], "--voxel-size", "40,5,5", "--out", str(tmp_path / "root"),
                  "--labels", inputs["seg"], "--class-map", "1=mito"], capsys)
    assert f"{inputs['seg']}: label values [2] have no class in --class-map" in err
    np.save(tmp_path / "soft.npy", arrays["er"] * 0.5)
    err = _error(["import", inputs["em"], "--voxel-size", "40,5,5", "--out", str(tmp_path / "root"),
                  "--label", f"er={tmp_path / 'soft.npy'}"], capsys)
    assert "soft.npy: label values must be whole numbers" in err
    err = _error(["import", inputs["em"], "--voxel-size", "40,5,5", "--out", str(tmp_path / "root"),
                  "--labels", inputs["seg"]], capsys)
    assert "--labels and --class-map go together" in err


def test_split_and_test_box_errors(tmp_path, import_args, capsys) -> None:
    args = import_args(tmp_path / "root")
    args[args.index("--gap-nm") + 1] = "2000"
    assert "too short for 4 validation + 50 gap (2000 nm)" in _error(args, capsys)
    assert "overlaps the labelled box" in _error(import_args(tmp_path / "root", "--test-box", "0:4,0:8,0:8"), capsys)
    assert "leaves the EM" in _error(import_args(tmp_path / "root", "--test-box", "0:40,0:8,0:8"), capsys)
    assert "expected Z0:Z1,Y0:Y1,X0:X1" in _error(import_args(tmp_path / "root", "--test-box", "0:4,0:8"), capsys)
    assert not (tmp_path / "root").exists()


def test_existing_roots_are_kept_unless_ours_and_asked(tmp_path, import_args, capsys) -> None:
    out = tmp_path / "root"
    assert main(import_args(out)) == 0
    assert "already exists; pass --overwrite" in _error(import_args(out), capsys)
    record = (out / "import.json").read_text()
    assert main(import_args(out, "--overwrite", "--val-fraction", "0.3")) == 0
    assert (out / "import.json").read_text() != record
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    err = _error(import_args(foreign, "--overwrite"), capsys)
    assert "was not written by `cellseg import`" in err and (foreign / "thesis.tex").read_text() == "precious"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(import_args(empty)) == 0  # an empty directory is simply used
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary leftovers


def test_a_failed_import_leaves_nothing(tmp_path, inputs, monkeypatch) -> None:
    from cellseg.ingest import imported_root

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(imported_root, "write_crop", boom)
    opts = ImportOptions(em=inputs["em"], out=tmp_path / "root", voxel_size_nm=(40, 5, 5),
                         labels=(("mito", inputs["mito"]),), gap_nm=80, experiments=())
    with pytest.raises(RuntimeError, match="disk full"):
        import_volume(opts, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["er.npy", "mito.tif", "sections", "seg.npy"]


def test_help_has_examples(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["import", "--help"])
    text = capsys.readouterr().out
    assert "examples:" in text and "cellseg import sbem_tiffs/ --voxel-size 40,5,5" in text
    assert "--class-map" in text and "--gap-nm" in text
