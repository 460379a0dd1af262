"""Float16 probability stores served to neuroglancer as uint8, transcoded as each chunk is read.

neuroglancer reads no float16 zarr arrays, and float16 is what `cellseg predict`, `predict-ensemble` and
`ensemble` write by default. Rather than asking for a re-prediction with `--uint8`, `cellseg view` serves such a
store a second time under a mount of its own (`TRANSCODED_SUFFIX`), where every float16 array reads as uint8:

- `.zarray`: the same array with dtype `|u1`, no compressor or filters, fill value 0;
- a chunk: decoded with the array's own codecs, then `round(255 p)` clipped to [0, 255] (NaN: 0), raw bytes;
- everything else (`.zattrs`, `.zgroup`, arrays of other dtypes) as stored.

The values equal what `--uint8` writes (`cellseg.data.prediction_store.quantise`), so the probability shader reads
both alike. Paths outside the served folder are refused (404), as by the plain file handler.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

TRANSCODED_SUFFIX = "+u8"  # a mount serving a store's float16 arrays as uint8
FLOAT16 = ("<f2", ">f2")
UINT8_SCALE = 255  # uint8 255 = probability 1.0, as `--uint8` stores


def transcoded_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """The `.zarray` of a float16 array as served: uint8, uncompressed, fill value 0; others unchanged."""
    if meta.get("dtype") not in FLOAT16:
        return meta
    return {**meta, "dtype": "|u1", "compressor": None, "filters": None, "fill_value": 0}


def transcoded_chunk(raw: bytes, meta: dict[str, Any]) -> bytes:
    """A stored chunk of a float16 array (`meta`: its `.zarray`) as the uint8 bytes of `transcoded_meta`."""
    import numcodecs

    data = raw
    if meta.get("compressor"):
        data = numcodecs.get_codec(meta["compressor"]).decode(data)
    for spec in reversed(meta.get("filters") or []):
        data = numcodecs.get_codec(spec).decode(data)
    probs = np.frombuffer(data, dtype=np.dtype(meta["dtype"])).astype(np.float32)
    out = np.rint(np.nan_to_num(probs, nan=0.0) * UINT8_SCALE)
    return np.clip(out, 0, UINT8_SCALE).astype(np.uint8).tobytes()


@lru_cache(maxsize=1024)
def _array_meta(array_dir: Path) -> dict[str, Any]:
    return json.loads((array_dir / ".zarray").read_text())


def _array_of(path: Path, root: Path) -> Path | None:
    """The array folder a chunk file belongs to (its nearest ancestor with `.zarray`, inside `root`)."""
    for parent in path.parents:
        if (parent / ".zarray").is_file():
            return parent
        if parent == root:
            return None
    return None


def transcoded_file(root: Path, relative: str) -> bytes | None:
    """The bytes served for `relative` under the store `root` (module docstring); None: not found or outside."""
    root = root.resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        return None
    if path.name == ".zarray":
        return json.dumps(transcoded_meta(json.loads(path.read_text()))).encode()
    array = _array_of(path, root) if not path.name.startswith(".") else None
    if array is None:
        return path.read_bytes()
    meta = _array_meta(array)
    return transcoded_chunk(path.read_bytes(), meta) if meta.get("dtype") in FLOAT16 else path.read_bytes()


def handler_class() -> type:
    """The tornado handler of a transcoding mount (neuroglancer's server is tornado: imported with it)."""
    import tornado.web

    class TranscodingHandler(tornado.web.RequestHandler):
        def initialize(self, path: str) -> None:
            self.root = Path(path)

        def set_default_headers(self) -> None:
            self.set_header("Access-Control-Allow-Origin", "*")  # the viewer reads from its own origin

        def get(self, relative: str) -> None:
            body = transcoded_file(self.root, relative)
            if body is None:
                raise tornado.web.HTTPError(404)
            self.set_header("Content-Type", "application/octet-stream")
            self.write(body)

    return TranscodingHandler
