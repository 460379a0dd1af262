"""``torch.compile`` traces every architecture as one graph (``torch._dynamo.explain`` on CPU).

Graph breaks cost speed silently (each break is a separate compiled region plus Python between
them), so the expected count is zero. An architecture that cannot avoid one goes in
``ALLOWED_BREAKS`` with the reason, and the test then pins the count.
"""

from __future__ import annotations

import pytest
import torch

from cellseg.models import build_model, list_models

# name -> (allowed number of breaks, why). Empty: no architecture needs one.
ALLOWED_BREAKS: dict[str, tuple[int, str]] = {}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", list_models())
def test_training_forward_has_no_graph_breaks(name: str) -> None:
    model = build_model(name, 1, 3, preset="tiny").train()
    image = torch.randn(2, 1, *model.spec.default_patch_vox)
    explanation = torch._dynamo.explain(model)(image)
    allowed, why = ALLOWED_BREAKS.get(name, (0, ""))
    reasons = [brk.reason for brk in explanation.break_reasons]
    assert explanation.graph_break_count == allowed, f"{name}: {reasons} (allowed: {allowed} {why})"


@pytest.mark.parametrize("name", ["swin_3d", "unet_3d"])
def test_inference_forward_has_no_graph_breaks(name: str) -> None:
    # swin: gradients off switch MONAI's window attention to its fused (SDPA) branch.
    model = build_model(name, 1, 3, preset="tiny").eval()
    image = torch.randn(1, 1, *model.spec.default_patch_vox)
    with torch.no_grad():
        explanation = torch._dynamo.explain(model)(image)
    assert explanation.graph_break_count == 0, [brk.reason for brk in explanation.break_reasons]
