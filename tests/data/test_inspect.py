"""`cellseg info` on a data root: the share of each dataset's EM at the padding value, counted on disk only."""

import numpy as np
from crafted import write_root

from cellseg.cli import main
from cellseg.data.inspect import padding_fraction
from cellseg.data.write import write_multiscale


def test_info_prints_the_padding_share_per_dataset(tmp_path, capsys):
    root = write_root(tmp_path / "root")  # EM 64³ at 4 nm, x < 6 voxels black: 6/64 of the volume
    assert main(["info", str(root)]) == 0
    out = capsys.readouterr().out
    assert "padding: 9.38 % of the EM on disk equals the padding value 0 (level s0, 262,144 voxels)" in out
    assert main(["info", str(root), "--pad-value", "200"]) == 0  # the bright half of the checkerboard
    assert "padding: 45.31 % of the EM on disk equals the padding value 200" in capsys.readouterr().out


def test_padding_share_counts_only_downloaded_chunks(tmp_path):
    em_dir = tmp_path / "em"
    em = np.full((32, 32, 32), 120, np.uint8)
    em[:, :, :8] = 0  # a black slab: one x-column of 8³ chunks
    write_multiscale(em_dir, em, voxel_size_nm=(8, 8, 8), translation_nm=(4, 4, 4), kind="em", num_levels=1,
                     chunks=(8, 8, 8))
    assert padding_fraction(em_dir) == ("s0", 0.25, 32**3)
    # A partial download lacks the slab's chunks (x chunk 0): read as 0 they would count as padding; only
    # the chunks on disk are counted, and none of them is black.
    for chunk in (em_dir / "s0").glob("*/*/0"):
        chunk.unlink()
    assert padding_fraction(em_dir) == ("s0", 0.0, 3 * 32**3 // 4)
