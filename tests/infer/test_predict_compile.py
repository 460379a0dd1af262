"""`cellseg predict --compile`: the compiled model (dynamo with its "eager" backend, which runs on CPU in
seconds) gives the eager result, the last batch padded to the compiled shape; a compiler that fails falls back
to eager with a warning instead of failing the run."""

import logging

import numpy as np
import pytest
import torch

from cellseg.config.inference import InferConfig
from cellseg.data.prediction_store import PredictionStore
from cellseg.infer.engine import tta_fold
from cellseg.infer.predict import predict_run


def _predict(run, crop: str, out, **opts) -> PredictionStore:
    predict_run(run, crop, out, InferConfig(tta=2, overlap=0.5, batch_size=3, progress=False, **opts))
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


def test_tta_folded_into_the_batch_gives_the_same_prediction(tiny_run, crop, tmp_path, monkeypatch):
    # --tta-fold 2: two TTA passes per forward (the compiled shape is 2 × batch, the last batch padded)
    monkeypatch.setenv("CELLSEG_COMPILE_BACKEND", "eager")
    torch._dynamo.reset()
    one = _predict(tiny_run, crop, tmp_path / "one.zarr", compile="on", tta_fold=1)
    two = _predict(tiny_run, crop, tmp_path / "two.zarr", compile="on", tta_fold=2)
    for c in one.completed():
        for channel in one.crop_channels(c):  # fp32 convolutions of 3 or 6 tiles: equal to float16 rounding
            np.testing.assert_allclose(two.read(c, channel), one.read(c, channel), atol=1e-3, err_msg=channel)
    with pytest.raises(ValueError, match="--tta-fold 3"):
        InferConfig(tta=8, tta_fold=3)


@pytest.mark.parametrize("run_fixture", ["tiny_run", "tiny_run_2d"])
def test_auto_compiles_only_a_job_large_enough_to_repay_it(run_fixture, request, tmp_path):
    import dataclasses
    import math

    from cellseg.infer.run import AUTO_COMPILE_MIN_GVOX, compile_decision, job_gvox, load_run
    from cellseg.infer.selection import select_targets

    run_dir = request.getfixturevalue(run_fixture)
    summaries = predict_run(run_dir, "test", tmp_path / "p.zarr", InferConfig(tta=2, overlap=0.5, progress=False))
    run = load_run(run_dir, "best", device="cpu")
    targets = select_targets("test", run.cfg, run.run_dir)
    # the planned job is what the sliding window then ran: tiles × TTA transforms × tile voxels
    ran = sum(s["tiles"] for s in summaries) * 2 * math.prod(run.cfg.data.patch_shape_vox) / 1e9
    assert job_gvox(run, targets, overlap=0.5, transforms=2) == pytest.approx(ran, rel=1e-9)
    on_gpu = dataclasses.replace(run, device=torch.device("cuda"))  # the decision reads only the device type
    auto = InferConfig(compile="auto")
    assert not compile_decision(on_gpu, auto, gvox=AUTO_COMPILE_MIN_GVOX / 10)  # a few crops: eager
    assert compile_decision(on_gpu, auto, gvox=AUTO_COMPILE_MIN_GVOX)
    assert compile_decision(on_gpu, auto, gvox=None)  # size unknown: compiled, as before
    assert not compile_decision(run, auto, gvox=10 * AUTO_COMPILE_MIN_GVOX)  # CPU: never
    assert compile_decision(run, InferConfig(compile="on"), gvox=0.0)
    assert not compile_decision(on_gpu, InferConfig(compile="off"), gvox=10 * AUTO_COMPILE_MIN_GVOX)


def test_tta_fold_policy():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert tta_fold(16, (1, 256, 256), 8, cuda) == 8  # 1 Mi voxels per pass: launch-bound, fold all 8
    assert tta_fold(64, (1, 256, 256), 8, cuda) == 4
    assert tta_fold(48, (1, 256, 256), 8, cuda) == 8  # 3 Mi voxels: 4 passes make 12 Mi, not enough
    assert tta_fold(2, (128, 128, 128), 8, cuda) == 4
    assert tta_fold(8, (128, 128, 128), 8, cuda) == 1  # 16 Mi voxels: already GPU-bound
    assert tta_fold(16, (1, 256, 256), 1, cuda) == 1  # no TTA: nothing to fold
    assert tta_fold(16, (1, 256, 256), 8, cpu) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_inductor_frozen_prediction_matches_eager_on_cuda(tiny_run, crop, tmp_path, monkeypatch):
    # the default backend (inductor) with freezing and folded TTA vs eager, both bf16 on the GPU
    monkeypatch.delenv("CELLSEG_COMPILE_BACKEND", raising=False)
    torch._dynamo.reset()
    eager = _predict(tiny_run, crop, tmp_path / "eager.zarr", compile="off", device="cuda", tta_fold=1)
    compiled = _predict(tiny_run, crop, tmp_path / "compiled.zarr", compile="on", device="cuda")
    for c in eager.completed():
        for channel in eager.crop_channels(c):
            np.testing.assert_allclose(compiled.read(c, channel), eager.read(c, channel), atol=0.03, err_msg=channel)


class _Shared(torch.nn.Module):
    """Models sharing one forward (one dynamo cache), as every SegModel shares `SegModel.forward`."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def test_more_compiled_models_than_dynamos_cache_limit_all_compile(monkeypatch):
    # dynamo's default limit is 8 entries per code object: a 9th model (an 8-member ensemble and one more shape)
    # ran eagerly, silently; each CompiledModel makes room for its own shapes
    from torch._dynamo.utils import counters

    from cellseg.runtime.compile import CompiledModel

    monkeypatch.setenv("CELLSEG_COMPILE_BACKEND", "eager")
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 8)  # torch's default, restored afterwards
    torch._dynamo.reset()
    counters.clear()
    models = [CompiledModel(_Shared(float(i))) for i in range(12)]
    for i, model in enumerate(models):  # static shapes: a new input shape is a new cache entry, as a new model is
        x = torch.ones(2, 3 + i)
        torch.testing.assert_close(model(x), x * i)
    assert counters["stats"]["unique_graphs"] == 12  # every model traced: none fell back to eager


def test_compiled_probabilities_are_one_graph_for_any_kept_channels(monkeypatch):
    # after a compiled model, the kept channels' sigmoid is one compiled kernel (inductor here, on the CPU): the
    # number of kept channels is dynamic, so crops scored on different label sets share the graph
    from torch._dynamo.utils import counters

    from cellseg.infer.engine import compiled_probabilities, probabilities

    monkeypatch.setenv("CELLSEG_COMPILE_BACKEND", "inductor")
    torch._dynamo.reset()
    counters.clear()
    post = compiled_probabilities("inductor")
    logits = torch.randn(2, 9, 8, 8, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    for keep in ([4, 0, 7], [1, 2, 3, 5, 8], [6, 2]):
        index = torch.tensor(keep)
        torch._dynamo.mark_dynamic(index, 0)
        torch.testing.assert_close(post(logits, index), probabilities(logits, index), rtol=0, atol=1e-6)
    assert post.compiled_ok and counters["stats"]["unique_graphs"] == 1
    one = torch.tensor([3])  # dynamo specialises a size of 1 (marked dynamic or not): one more graph, no error
    torch._dynamo.mark_dynamic(one, 0)
    torch.testing.assert_close(post(logits, one), probabilities(logits, one), rtol=0, atol=1e-6)
