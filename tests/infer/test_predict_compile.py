"""`cellseg predict --compile`: the compiled model (dynamo with its "eager" backend, which runs on CPU in
seconds) gives the eager result, the last batch padded to the compiled shape; a compiler that fails falls back
to eager with a warning instead of failing the run."""

import logging

import numpy as np
import pytest
import torch

from cellseg.infer.predict import PredictOptions, predict_run
from cellseg.infer.store import PredictionStore


def _predict(run, crop: str, out, **opts) -> PredictionStore:
    predict_run(run, crop, out, PredictOptions(tta=2, overlap=0.5, batch_size=3, progress=False, **opts))
    return PredictionStore.open(out)


def _assert_same(a: PredictionStore, b: PredictionStore) -> None:
    assert a.completed() == b.completed()
    for crop in a.completed():
        for channel in a.crop_channels(crop):
            np.testing.assert_array_equal(a.read(crop, channel), b.read(crop, channel), err_msg=f"{crop}/{channel}")


@pytest.fixture
def crop(tiny_synth_root) -> str:
    from cellseg.data.crops import Catalog

    return min(Catalog.from_dir(tiny_synth_root).test("2026").values(), key=lambda c: c.name).name.removeprefix("crop")


def test_compiled_prediction_equals_eager(tiny_run, crop, tmp_path, monkeypatch):
    monkeypatch.setenv("CELLSEG_COMPILE_BACKEND", "eager")  # dynamo traces the model; no code generation
    torch._dynamo.reset()
    eager = _predict(tiny_run, crop, tmp_path / "eager.zarr", compile="off")
    compiled = _predict(tiny_run, crop, tmp_path / "compiled.zarr", compile="on")
    assert compiled.provenance["compile"] == "on"
    assert sum(compiled.crop_attrs(c)["tiles"] % 3 for c in compiled.completed()) > 0  # a padded last batch ran
    _assert_same(eager, compiled)


def test_a_failing_compiler_falls_back_to_eager(tiny_run, crop, tmp_path, monkeypatch, caplog):
    def broken(graph, example_inputs):
        raise RuntimeError("this backend always fails")

    torch._dynamo.reset()
    torch._dynamo.register_backend(compiler_fn=broken, name="cellseg_test_broken")
    monkeypatch.setenv("CELLSEG_COMPILE_BACKEND", "cellseg_test_broken")
    eager = _predict(tiny_run, crop, tmp_path / "eager.zarr", compile="off")
    with caplog.at_level(logging.WARNING, logger="cellseg.infer.predict"):
        fallback = _predict(tiny_run, crop, tmp_path / "fallback.zarr", compile="on")
    assert "torch.compile failed" in caplog.text and "predicting eagerly" in caplog.text
    _assert_same(eager, fallback)
