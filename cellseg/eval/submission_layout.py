"""Which submission folder serves each truth crop, in each era, and when an official era gives up.

The 2025 evaluator looks for crop folders at the root of the unzipped archive and nowhere else; a
crop folder without `.zgroup` makes its zarr call fail. The 2026 evaluator repairs three mistakes:
a store zipped inside a folder (when it is the only `*.zarr` folder, its contents are moved to the
root), missing `.zgroup` files, and bare crop numbers (`557/` read as `crop557/`, tried only when no
folder name matches a truth crop). Where the 2025 evaluator would have rejected the whole submission,
cellseg repairs it as 2026 does, scores it, and records what the official evaluator would have done.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, field

from cellseg.eval.io import CropListing, Source, list_crop


@dataclass(frozen=True, kw_only=True)
class Layout:
    """The outcome of discovery.

    Attributes:
        crops: truth crop name → the submission's listing for it (crops found only).
        unmatched: submission folders that match no truth crop (ignored, as officially).
        notes: what was repaired or ignored, in words.
        official_failure: why the official evaluator of this era would reject the whole submission
            (empty when it would score it).
    """

    crops: dict[str, CropListing]
    unmatched: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    official_failure: tuple[str, ...] = field(default_factory=tuple)


def _nested_root(source: Source) -> tuple[str | None, str | None]:
    """The 2026 repair: (root key of the only nested `*.zarr` folder, or None; problem if several)."""
    folders = [f for f in source.zarr_folders() if f]
    # A nested store's own sub-folders named *.zarr are part of it, not another store.
    top = [f for f in folders if not any(f.startswith(g + "/") for g in folders if g != f)]
    if len(top) > 1:
        return None, f"{len(top)} nested *.zarr folders ({', '.join(top[:3])})"
    return (top[0] if top else None), None


def _folders(source: Source, root: str | None) -> dict[str, str]:
    """Folder name → key of the candidate crop folders for a root (the 2026 merge of a nested store)."""
    folders = {name: name for name in source.subdirs("")}
    if root:
        folders.pop(root.split("/", 1)[0], None)
        folders.update({name: f"{root}/{name}" for name in source.subdirs(root)})
    return folders


def _match(folders: dict[str, str], truth: set[str]) -> tuple[dict[str, str], bool]:
    """Truth name → folder key; the flag says the bare-number fallback was needed."""
    direct = {name: key for name, key in folders.items() if name in truth}
    if direct:
        return direct, False
    return {f"crop{name}": key for name, key in folders.items() if f"crop{name}" in truth}, True


def discover(source: Source, truth_crops: Iterable[str], *, repairs: bool) -> Layout:
    """Map truth crop names to submission crop folders the way an evaluator would (see module doc).

    Args:
        repairs: the evaluator repairs the layout as 2026 does; without, it reads crop folders at the root
            only and rejects what 2026 repairs, as 2025 does (`ScoringEra.repairs_layout`).
    """
    truth = set(truth_crops)
    notes: list[str] = []
    failure: list[str] = []
    nested, several = _nested_root(source)
    if several:
        notes.append(f"the submission holds {several}; read from its root")
        if repairs:  # it would repair a nested store, but cannot tell which one
            failure.append("it contains several *.zarr folders")
    root_folders = _folders(source, None)
    folders = root_folders
    if nested and (repairs or not any(n in truth for n in root_folders)):
        folders = _folders(source, nested)
        notes.append(f"the store was zipped inside the folder {posixpath.dirname(nested) or nested!r}; read it "
                     "from there (2026 repairs this)")
        if not repairs:
            failure.append("crop folders are not at the root of the archive")
    mapping, prefixed = _match(folders, truth)
    if prefixed and mapping:
        notes.append("crop folders are bare numbers; read them as crop<N> (2026 repairs this)")
        if not repairs:
            failure.append("crop folder names lack the 'crop' prefix")
    if not mapping:
        failure.append("no crop folder matches a truth crop ('No volumes found to score')")
        notes.append(f"no submission folder matches a truth crop (truth: {', '.join(sorted(truth)[:5])}, ...); "
                     "every crop is scored as missing")
    crops = {name: list_crop(source, key, name=name) for name, key in sorted(mapping.items())}
    no_group = [name for name, listing in crops.items() if not listing.has_zgroup]
    if no_group:
        notes.append(f"crop folders without .zgroup: {', '.join(no_group)} (2026 repairs this)")
        if not repairs:
            failure.append(f"crop folders without .zgroup ({', '.join(no_group)})")
    used = set(mapping.values())
    unmatched = tuple(sorted(name for name, key in folders.items() if key not in used))
    return Layout(crops=crops, unmatched=unmatched, notes=tuple(notes), official_failure=tuple(failure))
