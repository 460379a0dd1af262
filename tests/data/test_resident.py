"""Resident training data: the same batches as the streaming loader, deterministic, resumable, and placed
where the budgets allow (GPU, host memory, or streaming with a notice)."""

import logging
import math
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from crafted import write_root

from cellseg.classes import get_class
from cellseg.config.schema import AugmentConfig, DataConfig, LoaderConfig, replace
from cellseg.data import resident as resident_module
from cellseg.data.arrays import MultiscaleImage
from cellseg.data.blocks import Layout, block_nbytes
from cellseg.data.loader import build_train_data
from cellseg.data.resident import (
    SPEC_IN_PROCESS_MAX_BATCH,
    ResidentLoader,
    choose_placement,
    host_budget_bytes,
)
from cellseg.data.split import SplitEntry, write_datasplit
from cellseg.data.write import write_multiscale

NO_INTENSITY = dict(intensity_p=0.0, noise_p=0.0, blur_p=0.0, missing_section_p=0.0, dim_section_p=0.0,
                    misalign_p=0.0)
GB = 10**9


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_root(tmp_path_factory.mktemp("crafted"), black_slab=True)  # black EM: the padding rule matters


@pytest.fixture(scope="module")
def root_bits(tmp_path_factory):
    """Crops without their `all` array: targets travel in the "bits" encoding."""
    return write_root(tmp_path_factory.mktemp("crafted_bits"), black_slab=True, with_all=False)


def _data(root, **kw):
    base = dict(root=str(root), classes=("mito", "ecs", "golgi"), voxel_size_nm=(8.0, 8.0, 8.0),
                patch_shape_vox=(8, 8, 8))
    return DataConfig(**{**base, **kw})


def _build(data, *, batch=4, seed=3, rotate_p=0.5, workers=0, samples=64, **kw):
    return build_train_data(data, LoaderConfig(num_workers=workers, samples_per_epoch=samples),
                            AugmentConfig(rotate_p=rotate_p, **NO_INTENSITY), batch_size=batch, seed=seed,
                            device=torch.device("cpu"), **kw)


def _pair(data, **kw):
    """The resident loader and the streaming one of the same configuration."""
    resident, streaming = _build(data, **kw), _build(replace(data, resident="off"), **kw)
    assert resident.resident == "host" and streaming.resident == "off"
    return resident, streaming


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].shape == b[key].shape and a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), key


CASES = {  # name: (DataConfig overrides, target encoding)
    "3d-ids": (dict(), "ids"),
    "2d-ids": (dict(patch_shape_vox=(1, 12, 12), slice_axes=("z", "y", "x")), "ids"),
    "3d-bits": (dict(instance_boundaries=False), "bits"),
    "2d-bits": (dict(patch_shape_vox=(1, 12, 12), slice_axes=("z", "y", "x"), instance_boundaries=False), "bits"),
}


@pytest.mark.parametrize("case", CASES)
def test_batches_equal_the_streaming_loader_bit_for_bit(root, root_bits, tmp_path, case):
    """EM with a level at the training voxel size: every batch equals the DataLoader's, rotated or not."""
    overrides, encoding = CASES[case]
    data = _data(root if encoding == "ids" else root_bits, boundary_cache=str(tmp_path / "cache"), **overrides)
    resident, streaming = _pair(data)
    assert resident.dataset.target_mode == streaming.dataset.target_mode == encoding
    gathered = ResidentLoader(resident.loader.data, resident.loader.windows, device=torch.device("cpu"), gather=True)
    rotated = []
    for step, (a, b) in enumerate(zip(resident.loader, streaming.loader, strict=True)):
        _assert_same(a, b)
        _assert_same(gathered.batch(range(4 * step, 4 * step + 4)), b)  # the GPU's way of cutting, on the CPU
        rotated += a["rotate"].tolist()
        image, target, known = resident.augment(a, step)
        for x, y in zip((image, target, known), streaming.augment(b, step), strict=True):
            assert torch.equal(x, y)
        if step == 5:
            break
    assert any(rotated) and not all(rotated)
    if case.startswith("2d"):
        assert {resident.dataset.sampler(i).slice_axis for i in range(24)} == {0, 1, 2}


def test_boundary_channels_cover_the_whole_crop(root_bits):
    """In the "bits" encoding the streaming loader computes boundary channels per patch; blocks compute them over
    the whole crop (as `data.boundary_cache` does), so they may differ only on a patch's faces."""
    resident, streaming = _pair(_data(root_bits, patch_shape_vox=(12, 12, 12)), rotate_p=0.0)  # read = patch
    a = resident.loader.batch(range(12))
    b = torch.utils.data.default_collate([streaming.dataset[i] for i in range(12)])
    classes = (1 << 3) - 1  # bits 0-2: mito, ecs, golgi; bit 3: mito's boundary channel
    inside = (slice(None), slice(None), *[slice(1, -1)] * 3)
    for key in ("target_bits", "known_bits"):
        assert torch.equal(a[key] & classes, b[key] & classes), key
        assert torch.equal(a[key][inside], b[key][inside]), key
    assert not torch.equal(a["target_bits"], b["target_bits"])  # touching voxels on the faces, seen by blocks only
    for key in ("image", "crop", "seed", "rotate"):
        assert torch.equal(a[key], b[key]), key


def _odd_root(root):
    """EM 4 nm 64³; crop 1 annotated at 4 nm over 33³ voxels (mito ids, ecs, `all`), crop 2 (ecs) validating. The
    labels' 8 nm level (17³ voxels) reaches half an 8 nm voxel past the annotated box, onto the EM's 8 nm lattice."""
    ds, vs, t = "jrc_odd-1", (4.0, 4.0, 4.0), (44.0, 44.0, 44.0)
    zarr = root / ds / f"{ds}.zarr" / "recon-1"
    z, y, x = np.indices((64, 64, 64))
    mito = (z // 6 + y // 6 + x // 6) % 2 == 0
    write_multiscale(zarr / "em" / "fibsem-uint8", np.where(mito, 200, 60).astype(np.uint8), voxel_size_nm=vs,
                     translation_nm=(0, 0, 0), kind="em")
    box = (slice(11, 44),) * 3  # translation 44 nm = voxel 11 of the EM
    arrays = {"mito": (mito * (z // 12 + 1)).astype(np.uint32)[box], "ecs": (~mito).astype(np.uint8)[box],
              "all": np.where(mito, get_class("mito_lum").id, get_class("ecs").id).astype(np.uint8)[box]}
    gt = zarr / "labels" / "groundtruth"
    for crop, names in ((1, ("mito", "ecs", "all")), (2, ("ecs",))):
        for name in names:
            write_multiscale(gt / f"crop{crop}" / name, arrays[name], voxel_size_nm=vs, translation_nm=t, kind="labels")
    rows = [(1, "mito"), (1, "ecs"), (2, "ecs")]
    lines = [f"{c},{ds},{n},[4.0;4.0;4.0],[44.0;44.0;44.0],[33;33;33]" for c, n in rows]
    (root / "train_crop_manifest.csv").write_text("\n".join(["crop_name,dataset,class_label,voxel_size,translation,"
                                                            "shape", *lines]) + "\n")
    write_datasplit([SplitEntry(split=split, em_url=str(zarr / "em" / "fibsem-uint8"), crop_url=str(gt / f"crop{c}"),
                                classes=tuple(n for k, n in rows if k == c))
                     for c, split in ((1, "train"), (2, "validate"))], root / "datasplit.csv")
    return root


def test_a_coarser_label_level_past_the_box_is_kept(tmp_path):
    """At 8 nm the labels' s1 covers 17 voxels where s0's box holds 16.5: those reads are not padding."""
    data = DataConfig(root=str(_odd_root(tmp_path)), classes=("mito", "ecs"), voxel_size_nm=(8.0, 8.0, 8.0),
                      patch_shape_vox=(8, 8, 8))
    resident, streaming = _pair(data, samples=96)
    for a, b in zip(resident.loader, streaming.loader, strict=True):
        _assert_same(a, b)


def test_samples_snap_to_the_block_where_the_em_is_resampled(tiny_synth_root):
    """The tiny root has 4 nm, 5.24 x 4 x 4 nm and 8 nm EM: at 8 nm only the anisotropic one is resampled."""
    data = DataConfig(root=str(tiny_synth_root), classes=("mito", "er", "nuc", "ecs", "pm"),
                      voxel_size_nm=(8.0, 8.0, 8.0), patch_shape_vox=(16, 16, 16))
    td = _build(data, batch=1)
    kinds = {"same": 0, "snapped": 0}
    for i in range(40):
        spec = td.dataset.sampler(i)
        level = td.dataset.crops[spec.crop].em().choose_level(data.voxel_size_nm)
        a, b = td.loader.batch([i]), torch.utils.data.default_collate([td.dataset[i]])
        if level.voxel_size_nm == data.voxel_size_nm:
            _assert_same(a, b)
            kinds["same"] += 1
        else:  # a different window (moved by < half a voxel) of a block resampled once: same shapes, other values
            assert {k: (v.shape, v.dtype) for k, v in a.items()} == {k: (v.shape, v.dtype) for k, v in b.items()}
            kinds["snapped"] += 1
    assert kinds["same"] and kinds["snapped"]


@pytest.mark.parametrize("batch", [4, SPEC_IN_PROCESS_MAX_BATCH + 1])
def test_same_seed_same_batches_any_worker_count(root, batch):
    def batches(seed, workers):
        td = _build(_data(root), seed=seed, workers=workers, batch=batch)
        assert isinstance(td.loader, ResidentLoader)  # no worker reads data for resident data
        # Small batches compute their windows in the training process; larger ones in up to SPEC_WORKERS workers.
        assert td.loader.windows.num_workers == (0 if batch <= SPEC_IN_PROCESS_MAX_BATCH else min(workers, 2))
        return [b for _, b in zip(range(3), td.loader, strict=False)]

    reference = batches(1, 0)
    for a, b in zip(reference, batches(1, 2), strict=True):
        _assert_same(a, b)
    assert not all(torch.equal(a["image"], b["image"]) for a, b in zip(reference, batches(2, 0), strict=True))


def test_resume_mid_epoch_gives_the_uninterrupted_batches(root):
    """The `EpochSampler` contract: `set_epoch(e, start_batch=t)` continues exactly where a run stood, per rank."""
    td = _build(_data(root), batch=2, samples=8)  # 4 batches per epoch
    assert len(td.loader) == 4
    uninterrupted = []
    for epoch in range(2):
        td.sampler.set_epoch(epoch)
        uninterrupted += list(td.loader)
    td.sampler.set_epoch(1, start_batch=2)
    for a, b in zip(td.loader, uninterrupted[6:], strict=True):
        _assert_same(a, b)
    # Two ranks with batch 1 see the halves of one rank's batch of 2, as with the streaming loader.
    ranks = [_build(_data(root), batch=1, samples=8, rank=r, world_size=2) for r in (0, 1)]
    for t, (a, b) in enumerate(zip(*(r.loader for r in ranks), strict=True)):
        both = {k: torch.cat([a[k], b[k]]) for k in a}
        _assert_same(both, uninterrupted[t])


def test_memory_accounting_and_margins(root):
    td = _build(_data(root, patch_shape_vox=(12, 12, 12)))
    loader, layout = td.loader, Layout.of(td.dataset)
    assert layout.width == 1 + layout.targets == 1 + 1 + 2 * 1  # EM, `all` id, mito's boundary target and known
    for block, crop in zip(loader.data.blocks, td.dataset.crops, strict=True):
        box = block.targets.shape[:3]  # channel-last
        assert block.nbytes == math.prod(block.grid.shape_vox) + layout.targets * math.prod(box)
        assert block.nbytes == block_nbytes(block.grid, crop, layout)
        assert math.prod(box) == (24 + 2 * 2) ** 3  # targets over the crop (24³ at 8 nm) and 2 voxels, EM over all
    assert loader.data.nbytes == sum(b.nbytes for b in loader.data.blocks)
    for i in range(0, 4000, 7):  # no window ever leaves its block (`window_start` raises if one does)
        loader.batch([i])
    bits = Layout(ids=False, nbits=1)
    assert bits.width == 3 and set(bits.batch(torch.zeros(2, 3, 1, 1, 1))) == {"image", "target_bits", "known_bits"}


def test_small_budget_streams_with_a_notice(root, caplog):
    with caplog.at_level(logging.INFO, logger="cellseg.data.resident"):
        td = _build(_data(root, resident_host_gb=0.0))
    assert td.resident == "off" and isinstance(td.loader, torch.utils.data.DataLoader)
    assert any(r.levelno == logging.WARNING and "streams from zarr" in r.getMessage() and "resident_host_gb"
               in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cellseg.data.resident"):
        assert _build(_data(root, resident="off")).resident == "off"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.endswith("resident")]  # asked for


def test_resident_off_in_yaml(tmp_path):
    from cellseg.config import load_run_config

    smoke = Path(__file__).resolve().parents[2] / "configs" / "smoke" / "unet_3d.yaml"
    assert load_run_config(smoke, ["data.resident=off"]).data.resident == "off"  # YAML 1.1 reads `off` as false
    with pytest.raises(ValueError, match=r"data.resident: True is not one of"):
        load_run_config(smoke, ["data.resident=on"])


def test_gpu_without_cuda_falls_back_to_host(root, caplog):
    with caplog.at_level(logging.INFO, logger="cellseg.data.resident"):
        td = _build(_data(root, resident="gpu"))
    assert td.resident == "host" and td.loader.data.blocks[0].em.device.type == "cpu"
    assert any(r.levelno == logging.WARNING and "no CUDA device" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("mode", "cuda", "room", "host", "expected"), [
    ("auto", True, 10 * GB, 0, "gpu"),  # 4 GB fit half of the GPU's 10 GB
    ("auto", True, 6 * GB, 8 * GB, "host"),  # not half of 6 GB: host memory
    ("gpu", True, 6 * GB, 0, "gpu"),  # asked for: all of the room
    ("gpu", True, 3 * GB, 0, "off"),  # no room anywhere
    ("auto", False, 100 * GB, 8 * GB, "host"),
    ("auto", False, 0, 2 * GB, "off"),
    ("host", True, 100 * GB, 8 * GB, "host"),
    ("host", True, 100 * GB, 2 * GB, "off"),
    ("off", True, 100 * GB, 100 * GB, "off"),
])
def test_choose_placement(mode, cuda, room, host, expected):
    placement, why = choose_placement(mode, 4 * GB, cuda=cuda, gpu_room_bytes=room, gpu_share=0.5,
                                      host_budget_bytes=host)
    assert placement == expected and why


def test_host_budget_is_shared_by_the_machines_ranks(root, monkeypatch):
    data = _data(root, resident_host_gb=0.002)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    one = host_budget_bytes(data)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert host_budget_bytes(data) == one // 4 == 500_000


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_blocks_give_the_streaming_batches_on_the_gpu(root, tmp_path):
    device = torch.device("cuda")

    def build(resident):
        data = _data(root, boundary_cache=str(tmp_path / "cache"), resident=resident)
        return build_train_data(data, LoaderConfig(num_workers=0, samples_per_epoch=32),
                                AugmentConfig(rotate_p=0.5, **NO_INTENSITY), batch_size=4, seed=3, device=device)

    gpu, host, streaming = build("gpu"), build("host"), build("off")
    assert (gpu.resident, host.resident, streaming.resident) == ("gpu", "host", "off")
    assert gpu.loader.data.blocks[0].em.is_cuda and not host.loader.data.blocks[0].em.is_cuda
    for a, b, c in zip(gpu.loader, host.loader, streaming.loader, strict=True):
        assert all(v.is_cuda for v in a.values()) and all(v.is_cuda for v in b.values())
        c = {k: v.to(device) for k, v in c.items()}
        _assert_same(a, c)
        _assert_same(b, c)
        assert all(v.to(device, non_blocking=True) is v for v in a.values())  # the trainer copies nothing


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_allocation_failure_falls_back_to_host(root, monkeypatch, caplog):
    real = resident_module.BlockStore

    def no_gpu_memory(grids, crops, *, layout, device):
        if device.type == "cuda":
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(grids, crops, layout=layout, device=device)

    monkeypatch.setattr(resident_module, "BlockStore", no_gpu_memory)
    with caplog.at_level(logging.INFO, logger="cellseg.data.resident"):
        td = build_train_data(_data(root, resident="gpu"), LoaderConfig(num_workers=0, samples_per_epoch=8),
                              AugmentConfig(), batch_size=2, seed=0, device=torch.device("cuda"),
                              gpu_room_bytes=10**15)
    assert td.resident == "host" and "allocation failed" in caplog.text
    assert next(iter(td.loader))["image"].is_cuda


def test_a_black_hole_inside_the_volume_stays_data_and_the_black_border_does_not(tmp_path):
    """The padding rule of resident blocks (`blocks.box_padding`): EM at the padding value connected to the volume's
    edge is unknown for every channel; a black region inside the imaged volume (a lipid droplet, a saturated
    membrane) stays known, unless `data.padding_mask=value` asks for the old rule."""
    root = write_root(tmp_path / "root", black_slab=True)  # x < 24 nm (6 EM voxels of 4 nm) black: the edge
    em_path = root / "jrc_test-1" / "jrc_test-1.zarr" / "recon-1" / "em" / "fibsem-uint8"
    em = MultiscaleImage(em_path).read_level("s0")
    em[32:40, 32:40, 32:40] = 0  # a black hole of 32 nm in the middle of crop 1
    shutil.rmtree(em_path)
    write_multiscale(em_path, em, voxel_size_nm=(4, 4, 4), translation_nm=(0, 0, 0), kind="em")
    known = {}
    for mode in ("edge", "value"):
        td = _build(_data(root, padding_mask=mode))
        index = next(i for i, c in enumerate(td.train_crops) if c.name == "crop1")
        block = td.loader.data.blocks[index]
        nbits = Layout.of(td.dataset).nbits
        known[mode] = block.targets[..., -nbits].numpy() != 0  # known bits of channels 0-7 over the box (z, y, x)
    vs = block.grid.voxel_size_nm[0]
    origin = [t + o * vs for t, o in zip(block.grid.translation_nm, block.offset, strict=True)]  # box voxel 0 (nm)
    hole = tuple(slice(round((128 - t) / vs) + 1, round((160 - t) / vs) - 1) for t in origin)  # inside 128-160 nm
    edge = round((16 - origin[2]) / vs)  # a box voxel of x < 24 nm, in the black slab
    assert known["edge"][hole].all() and not known["value"][hole].any()
    assert edge >= 0 and not known["edge"][:, :, edge].any() and not known["value"][:, :, edge].any()


def test_reading_in_threads_gives_the_same_index_and_blocks(root, monkeypatch):
    """Set-up reads the crops in threads (`cellseg.data.threads`); the crops, their foreground index (subsampled
    from one generator) and the resident blocks are those of reading one crop after another."""
    from cellseg.data import threads

    def build(n):
        monkeypatch.setattr(threads, "MAX_READ_THREADS", n)
        monkeypatch.setattr(threads, "usable_cores", lambda: 4)
        return _build(_data(root, resident="host"))

    one, four = build(1), build(4)
    assert [c.name for c in one.train_crops] == [c.name for c in four.train_crops]
    for a, b in zip(one.dataset.sampler.index.points, four.dataset.sampler.index.points, strict=True):
        for pa, pb in zip(a, b, strict=True):
            np.testing.assert_array_equal(pa, pb)
    for a, b in zip(one.loader.data.store.blocks, four.loader.data.store.blocks, strict=True):
        assert torch.equal(a.em, b.em) and torch.equal(a.targets, b.targets)


def test_window_workers_receive_a_small_payload(root):
    """A spawned worker's payload beyond a pipe's buffer (64 KiB on Linux) makes each worker's start wait until the
    worker has imported torch, one after another: the window workers get the sampling rule without the crops, and
    the foreground index as shared memory."""
    from multiprocessing.reduction import ForkingPickler

    td = _build(_data(root), batch=SPEC_IN_PROCESS_MAX_BATCH + 1, workers=2)
    specs = td.loader.windows.dataset
    payload = ForkingPickler.dumps(specs)  # what DataLoader's spawn context sends each worker
    assert len(payload) < 16 * 1024
    clone = pickle.loads(payload)
    assert clone.dataset is None and len(clone) == len(specs)
    for i in range(32):
        assert torch.equal(clone[i], specs[i])
