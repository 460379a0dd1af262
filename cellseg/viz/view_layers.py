"""What `cellseg view` shows: the layers found in a data root and in prediction stores, checked before serving.

Each layer is one OME-NGFF 0.4 multiscale group (zarr v2) that neuroglancer reads itself, at the world
position its metadata declares (scale and translation in nm, axes z, y, x):

    EM            ROOT/<ds>/<ds>.zarr/recon-1/em/fibsem-uint8                       image
    probabilities OUT.zarr/probabilities/<class>  (predict-volume, uint8 = 255 p)   image, probability shader
    labels        OUT.zarr/labels/<class>         (predict-volume --instances)       segmentation
    crop stores   PRED.zarr/crop<N>/<channel>     (predict, ensemble, postprocess)   image or segmentation
    truth         ROOT/<ds>/<ds>.zarr/recon-1/labels/groundtruth/crop<N>/<class>    segmentation

A layer names its group by a *mount* (the served folder: "root", "store1", ...) and a path inside it, so
the state can be built without a server (`view_state.viewer_state`) and the files served from anywhere.
Float16 probabilities (the default of `cellseg predict`) are shown through a mount of their own that serves them
as uint8 (`view_transcode`: neuroglancer reads no float16 zarr arrays); an array of any other dtype neuroglancer
cannot read, and a crop of another dataset than the one shown, is left out with a message naming it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cellseg.data.crops import crop_sort_key, is_crop_name
from cellseg.data.ngff import LevelMeta, parse_multiscales
from cellseg.data.write import describe
from cellseg.viz.view_transcode import FLOAT16, TRANSCODED_SUFFIX

log = logging.getLogger(__name__)

EM_GROUP = "recon-1/em/fibsem-uint8"
TRUTH_GROUP = "recon-1/labels/groundtruth"
VOLUME_KIND = "volume-prediction"  # the `cellseg.kind` of a predict-volume store
CROP_KINDS = ("probabilities", "segmentation")  # the `cellseg.kind` of a crop prediction store
ROOT_MOUNT = "root"
BOUNDARY_SUFFIX = "_boundary"  # auxiliary channels of crop stores, not classes
# zarr v2 dtypes neuroglancer 2.41 reads (src/util/numpy_dtype.ts); float16 ("<f2") is not among them
READABLE_DTYPES = {"|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f4", ">u2", ">u4", ">u8", ">f4"}

LayerKind = Literal["em", "probabilities", "labels"]


@dataclass(frozen=True, kw_only=True)
class Layer:
    """One multiscale group to show.

    Attributes:
        name: the layer's name in the viewer (unique).
        kind: "em" (grey image), "probabilities" (image with the probability shader) or "labels" (masks
            or ids: a segmentation layer).
        mount: the served folder holding it ("root" or "store<i>").
        path: the group's path inside the mount (POSIX).
        class_name: the class shown ("" for the EM).
        dtype: the zarr dtype of its `s0` (e.g. "|u1", "<u8").
        visible: shown when the viewer opens.
    """

    name: str
    kind: LayerKind
    mount: str
    path: str
    class_name: str = ""
    dtype: str = "|u1"
    visible: bool = True

    @property
    def is_mask(self) -> bool:
        """A semantic 0/1 mask (uint8), as opposed to object ids."""
        return self.kind == "labels" and self.dtype == "|u1"


@dataclass(frozen=True, kw_only=True)
class ViewPlan:
    """Everything `cellseg view` serves and shows.

    Attributes:
        dataset: the dataset whose EM is shown.
        mounts: served folder name → local directory.
        layers: EM first, then predictions store by store, then truth crops.
        em_levels: the EM's levels (voxel size and translation in nm, z y x), finest first.
        em_shape_vox: the EM's `s0` shape (z, y, x).
        focus_nm: where the view starts (world nm, z y x): the centre of the crop asked for (`crop`), else of the
            first whole-volume store's ROI, else of the first crop of the first crop store, else the EM's centre.
        focus_extent_nm: the extent (nm, z y x) of that region, which the first view fits into its panels.
    """

    dataset: str
    mounts: dict[str, Path]
    layers: tuple[Layer, ...]
    em_levels: tuple[LevelMeta, ...]
    em_shape_vox: tuple[int, int, int]
    focus_nm: tuple[float, float, float]
    focus_extent_nm: tuple[float, float, float] = (0.0, 0.0, 0.0)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: unreadable JSON ({err})") from err
    return data if isinstance(data, dict) else {}


def _s0_dtype(group: Path) -> str:
    """The zarr dtype of a multiscale group's finest level (the first listed)."""
    levels = parse_multiscales(_read_json(group / ".zattrs"), source=str(group))
    meta = _read_json(group / levels[0].path / ".zarray")
    if "dtype" not in meta:
        raise ValueError(f"{group / levels[0].path}: no zarr array here (.zarray missing)")
    return str(meta["dtype"])


def _is_multiscale(group: Path) -> bool:
    return "multiscales" in _read_json(group / ".zattrs")


def root_datasets(root: Path) -> list[str]:
    """Datasets of a data root that hold EM (`<ds>/<ds>.zarr/recon-1/em/fibsem-uint8`), sorted."""
    return sorted(p.name for p in root.iterdir() if p.is_dir() and _is_multiscale(p / f"{p.name}.zarr" / EM_GROUP))


def _store_attrs(path: Path) -> dict[str, Any]:
    """The `cellseg` entry of a prediction store's `.zattrs`, checked.

    Raises:
        FileNotFoundError: no such directory.
        ValueError: not a store written by predict-volume, predict, ensemble or postprocess.
    """
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no prediction store here")
    attrs = _read_json(path / ".zattrs").get("cellseg")
    if not isinstance(attrs, dict) or attrs.get("kind") not in (VOLUME_KIND, *CROP_KINDS):
        raise ValueError(f"{path}: not a prediction store (it is {describe(path)}); cellseg view shows stores "
                         "written by predict-volume, predict, predict-ensemble, ensemble or postprocess")
    return attrs


def store_dataset(path: Path) -> str | None:
    """The dataset a predict-volume store covers (None for crop stores)."""
    attrs = _store_attrs(path)
    return str(attrs["dataset"]) if attrs.get("kind") == VOLUME_KIND and attrs.get("dataset") else None


Box = tuple[tuple[float, float, float], tuple[float, float, float]]  # (lower corner, extent), world nm, z y x


def _roi_box_nm(path: Path) -> Box | None:
    """A predict-volume store's ROI (`roi_nm`: lower corner and extent, world nm)."""
    roi = _store_attrs(path).get("roi_nm")
    try:
        return (tuple(float(o) for o in roi["offset"]), tuple(float(n) for n in roi["shape"]))  # type: ignore[return-value,index]
    except (TypeError, KeyError, ValueError):
        return None


def _find_crop(root: Path, crop: str) -> Any:
    """Crop `crop` ("12" or "crop12") of the data root's catalogue (a training or test crop).

    Raises:
        ValueError: a crop the root does not list.
    """
    from cellseg.data.crops import Catalog, crop_id

    catalog = Catalog.from_dir(root)
    number = crop_id(crop if crop.startswith("crop") else f"crop{crop}")
    found = catalog.train.get(number) or next((t[number] for t in catalog.tests.values() if number in t), None)
    if found is None:
        raise ValueError(f"--crop {crop}: not a crop of {root} (its manifests list none by that number)")
    return found


def _crop_box_nm(root: Path, crop: str, dataset: str) -> Box:
    """The box around every annotation (or test box) of crop `crop` ("12" or "crop12") of the data root.

    Raises:
        ValueError: a crop the root does not list, or one of another dataset.
    """
    found = _find_crop(root, crop)
    if found.dataset != dataset:
        raise ValueError(f"--crop {crop}: a crop of {found.dataset}, not of the dataset shown ({dataset})")
    lo = [min(g.translation_nm[d] - g.voxel_size_nm[d] / 2 for g in found.labels.values()) for d in range(3)]
    hi = [max(g.translation_nm[d] + (g.shape_vox[d] - 0.5) * g.voxel_size_nm[d] for g in found.labels.values())
          for d in range(3)]
    return tuple(lo), tuple(h - low for h, low in zip(hi, lo, strict=True))  # type: ignore[return-value]


def _first_crop_box_nm(store: Path, layers: Sequence[Layer]) -> Box | None:
    """The box of the first crop a crop store shows (its s0 grid, from the multiscale metadata)."""
    for layer in layers:
        if is_crop_name(layer.path.split("/")[0]):
            group = store / layer.path
            level = parse_multiscales(_read_json(group / ".zattrs"), source=str(group))[0]
            shape = _read_json(group / level.path / ".zarray").get("shape")
            if isinstance(shape, list) and len(shape) == 3:
                lo = tuple(t - v / 2 for t, v in zip(level.translation_nm, level.voxel_size_nm, strict=True))
                return lo, tuple(n * v for n, v in zip(shape, level.voxel_size_nm, strict=True))  # type: ignore[return-value]
    return None


def em_centre_nm(levels: Sequence[LevelMeta], shape_vox: Sequence[int]) -> tuple[float, float, float]:
    """World centre (nm, z y x) of an EM `s0`: half its extent past its lower corner (half a voxel before the
    centre of voxel 0)."""
    s0 = levels[0]
    return tuple(t - v / 2 + n * v / 2 for t, v, n in zip(s0.translation_nm, s0.voxel_size_nm,  # type: ignore[return-value]
                                                         shape_vox, strict=True))


def _wanted(name: str, classes: Sequence[str] | None) -> bool:
    return classes is None or name in classes


def _stem(path: Path) -> str:
    return path.name.removesuffix(".zarr") or path.name


def volume_store_layers(path: Path, mount: str, *, classes: Sequence[str] | None) -> list[Layer]:
    """Layers of a predict-volume store: `probabilities/<class>` (images) and `labels/<class>` (segmentations)."""
    attrs = _store_attrs(path)
    stem, layers = _stem(path), []
    for part, kind in (("probabilities", "probabilities"), ("labels", "labels")):
        for cls in attrs.get("classes", []):
            group = path / part / cls
            if _wanted(cls, classes) and _is_multiscale(group):
                layers.append(Layer(name=f"{stem}/{part}/{cls}", kind=kind, mount=mount, path=f"{part}/{cls}",  # type: ignore[arg-type]
                                    class_name=cls, dtype=_s0_dtype(group)))
    if not layers:
        log.warning("%s: no probabilities or labels written yet%s", path,
                    f" for {', '.join(classes)}" if classes is not None else "")
    return layers


def crop_store_layers(path: Path, mount: str, *, dataset: str, classes: Sequence[str] | None) -> list[Layer]:
    """Layers of a crop prediction store: every complete crop of `dataset`, one layer per class channel."""
    attrs = _store_attrs(path)
    kind: LayerKind = "probabilities" if attrs["kind"] == "probabilities" else "labels"
    stem, layers, transcoded, unreadable, elsewhere = _stem(path), [], [], [], []
    crops = sorted((p.name for p in path.iterdir() if is_crop_name(p.name)), key=crop_sort_key)
    for crop in crops:
        crop_attrs = _read_json(path / crop / ".zattrs").get("cellseg_crop")
        if not isinstance(crop_attrs, dict):
            continue  # not complete yet
        if crop_attrs.get("dataset", dataset) != dataset:
            elsewhere.append(f"{crop} ({crop_attrs['dataset']})")
            continue
        for channel in crop_attrs.get("channels", attrs.get("channels", [])):
            if channel.endswith(BOUNDARY_SUFFIX) or not _wanted(channel, classes):
                continue
            dtype, served = _s0_dtype(path / crop / channel), mount
            if dtype in FLOAT16:
                transcoded.append(f"{crop}/{channel}")
                dtype, served = "|u1", f"{mount}{TRANSCODED_SUFFIX}"
            elif dtype not in READABLE_DTYPES:
                unreadable.append(f"{crop}/{channel} ({dtype})")
                continue
            layers.append(Layer(name=f"{stem}/{crop}/{channel}", kind=kind, mount=served, path=f"{crop}/{channel}",
                                class_name=channel, dtype=dtype))
    if transcoded:
        log.info("%s: %d float16 channels served as uint8 (round(255 p), transcoded as read)", path, len(transcoded))
    if unreadable:
        log.warning("%s: %d channels left out, of dtypes neuroglancer cannot read: %s", path, len(unreadable),
                    _listing(unreadable))
    if elsewhere:
        log.warning("%s: %d crops of other datasets left out (view them with --dataset): %s", path, len(elsewhere),
                    _listing(elsewhere))
    return layers


def _listing(names: Sequence[str], limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def truth_layers(root: Path, dataset: str, *, classes: Sequence[str] | None, visible: bool) -> list[Layer]:
    """Segmentation layers of the dataset's truth crops (`recon-1/labels/groundtruth/crop<N>/<class>`)."""
    base = Path(f"{dataset}/{dataset}.zarr/{TRUTH_GROUP}")
    folder = root / base
    if not folder.is_dir():
        return []
    layers = []
    for crop in sorted((p.name for p in folder.iterdir() if is_crop_name(p.name)), key=crop_sort_key):
        for group in sorted((folder / crop).iterdir()):
            if group.is_dir() and _wanted(group.name, classes) and _is_multiscale(group):
                layers.append(Layer(name=f"truth/{crop}/{group.name}", kind="labels", mount=ROOT_MOUNT,
                                    path=(base / crop / group.name).as_posix(), class_name=group.name,
                                    dtype=_s0_dtype(group), visible=visible))
    return layers


def _choose_dataset(root: Path, dataset: str | None, stores: Sequence[Path]) -> str:
    datasets = root_datasets(root)
    if not datasets:
        raise ValueError(f"{root}: no dataset with EM here (expected <ds>/<ds>.zarr/{EM_GROUP}); is it a data "
                         "root (cellseg synth, fetch or import)?")
    named = sorted({d for d in (store_dataset(s) for s in stores) if d})
    if dataset is None:
        if len(named) > 1:
            raise ValueError(f"the stores cover different datasets ({', '.join(named)}): view one at a time")
        dataset = named[0] if named else (datasets[0] if len(datasets) == 1 else None)
        if dataset is None:
            raise ValueError(f"{root} holds {len(datasets)} datasets ({', '.join(datasets)}): choose one with --dataset")
    if dataset not in datasets:
        raise ValueError(f"dataset {dataset!r} is not in {root} (datasets with EM: {', '.join(datasets)})")
    for store in stores:
        if (other := store_dataset(store)) not in (None, dataset):
            raise ValueError(f"{store} covers dataset {other!r}, not {dataset!r}")
    return dataset


def plan_view(root: str | Path, *, dataset: str | None = None, stores: Sequence[str | Path] = (),
              classes: Sequence[str] | None = None, crop: str | None = None) -> ViewPlan:
    """Find and check every layer to show: the EM of `dataset`, each store's predictions, the truth crops.

    Args:
        root: the data root.
        dataset: the dataset to show; default the one a predict-volume store names, `crop`'s, or the root's only
            one.
        stores: prediction stores (predict-volume's OUT.zarr, or crop stores of predict/ensemble/postprocess).
        classes: show only these classes (default: every class of the stores; the truth's classes are those
            of the stores, or all of them when no store is given).
        crop: start the view on this crop of the root ("12" or "crop12"), fitted to its box.

    Raises:
        FileNotFoundError: a missing root or store.
        ValueError: a root without EM, a dataset not in it, a store that is not a prediction store or covers
            another dataset, `classes` that match no layer.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such data root")
    store_paths = [Path(s) for s in stores]
    if dataset is None and crop is not None and not any(store_dataset(s) for s in store_paths):
        dataset = _find_crop(root, crop).dataset  # no store names a dataset: the crop asked for does
    chosen = _choose_dataset(root, dataset, store_paths)
    em_group = root / chosen / f"{chosen}.zarr" / EM_GROUP
    em_levels = tuple(parse_multiscales(_read_json(em_group / ".zattrs"), source=str(em_group)))
    shape = _read_json(em_group / em_levels[0].path / ".zarray").get("shape")
    if not isinstance(shape, list) or len(shape) != 3:
        raise ValueError(f"{em_group / em_levels[0].path}: no 3D zarr array here")
    em = Layer(name=f"{chosen} EM", kind="em", mount=ROOT_MOUNT, path=em_group.relative_to(root).as_posix(),
               dtype=_s0_dtype(em_group))
    mounts, predictions, boxes = {ROOT_MOUNT: root}, [], []
    if crop is not None:
        boxes.append(_crop_box_nm(root, crop, chosen))
    for i, store in enumerate(store_paths, start=1):
        mount = f"store{i}"
        mounts[mount] = mounts[f"{mount}{TRANSCODED_SUFFIX}"] = store  # as stored, and float16 as uint8
        if _store_attrs(store)["kind"] == VOLUME_KIND:
            predictions += volume_store_layers(store, mount, classes=classes)
            boxes.append(_roi_box_nm(store))
        else:
            layers = crop_store_layers(store, mount, dataset=chosen, classes=classes)
            predictions += layers
            boxes.append(_first_crop_box_nm(store, layers))
    truth_classes = classes if classes is not None or not predictions else sorted({p.class_name for p in predictions})
    truth = truth_layers(root, chosen, classes=truth_classes, visible=not predictions)
    if classes is not None and not predictions and not truth:
        raise ValueError(f"no prediction or truth layer of {', '.join(classes)} in {root} (dataset {chosen})"
                         + (f" or {', '.join(map(str, store_paths))}" if store_paths else ""))
    names = [layer.name for layer in (em, *predictions, *truth)]
    if len(set(names)) != len(names):
        raise ValueError(f"two stores share a name ({', '.join(sorted({n for n in names if names.count(n) > 1}))}); "
                         "rename one")
    shape_vox = tuple(int(v) for v in shape)
    box = next((b for b in boxes if b is not None), None)
    if box is None:  # the EM's whole extent
        s0 = em_levels[0]
        box = (tuple(t - v / 2 for t, v in zip(s0.translation_nm, s0.voxel_size_nm, strict=True)),
               tuple(n * v for n, v in zip(shape_vox, s0.voxel_size_nm, strict=True)))
    centre = tuple(o + n / 2 for o, n in zip(*box, strict=True))
    return ViewPlan(dataset=chosen, mounts=mounts, layers=(em, *predictions, *truth), em_levels=em_levels,
                    em_shape_vox=shape_vox, focus_nm=centre, focus_extent_nm=box[1])  # type: ignore[arg-type]


def show_only(plan: ViewPlan, patterns: Sequence[str]) -> ViewPlan:
    """`plan` with only the layers whose names match one of `patterns` (shell-style, e.g. "*EM", "pred/*/mito")
    visible; the others stay in the state, hidden.

    Raises:
        ValueError: a pattern that matches no layer (the layers are named).
    """
    import dataclasses
    import fnmatch

    names = [layer.name for layer in plan.layers]
    unmatched = [p for p in patterns if not fnmatch.filter(names, p)]
    if unmatched:
        raise ValueError(f"--layers {', '.join(unmatched)}: no such layer; the layers are {_listing(names, 12)}")
    layers = tuple(dataclasses.replace(layer, visible=any(fnmatch.fnmatchcase(layer.name, p) for p in patterns))
                   for layer in plan.layers)
    return dataclasses.replace(plan, layers=layers)
