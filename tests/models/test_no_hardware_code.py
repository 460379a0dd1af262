"""Model code knows nothing about hardware (STYLE.md habit 1): a scan of cellseg/models/ source.

Only code tokens are scanned: docstrings and comments may *mention* ``torch.compile`` or autocast
when explaining a design choice; what they may not do is call them.
"""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

import pytest

import cellseg.models

MODELS_DIR = Path(cellseg.models.__file__).parent
FORBIDDEN = (
    ".cuda(",
    "autocast",
    "DistributedDataParallel",
    "torch.compile",
    "GradScaler",
    "get_rank",
    "is_initialized",
)
SOURCES = sorted(MODELS_DIR.rglob("*.py"))


def code_without_strings_and_comments(path: Path) -> str:
    """The file's tokens joined back, minus string literals and comments."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    kept = [tok.string for tok in tokens if tok.type not in (tokenize.STRING, tokenize.COMMENT)]
    return "".join(kept)


def test_the_scan_sees_every_model_file() -> None:
    names = {path.name for path in SOURCES}
    assert {"registry.py", "base.py", "unet.py", "resnet.py", "swin.py", "vit.py"} <= names


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: path.name)
def test_no_hardware_code_under_models(path: Path) -> None:
    code = code_without_strings_and_comments(path)
    found = [name for name in FORBIDDEN if name in code]
    assert not found, f"{path.name} uses {found}: hardware code belongs in cellseg/runtime/"


def test_the_scan_would_catch_a_call(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('"""torch.compile is fine in prose."""\nmodel = torch.compile(model)  # not in code\n')
    assert "torch.compile" in code_without_strings_and_comments(sample)
    sample.write_text('"""torch.compile is fine in prose."""\n# x.cuda() in a comment\n')
    assert not any(name in code_without_strings_and_comments(sample) for name in FORBIDDEN)
