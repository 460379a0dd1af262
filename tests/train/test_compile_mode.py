"""`train.compile_mode`: the key loads, round-trips and is validated; a non-default mode compiles a tiny model on CPU
(CUDA graphs need CUDA: inductor skips them on CPU and the model still runs); meta.json records the mode."""

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from cellseg.config import dump, load_run_config
from cellseg.config.schema import COMPILE_MODES, TrainConfig
from cellseg.models.blocks import conv_stage
from cellseg.train.compile_choice import maybe_compile
from cellseg.train.trainer import train

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "smoke" / "unet_3d.yaml"


def test_compile_mode_defaults_and_round_trips(tmp_path):
    assert load_run_config(SMOKE).train.compile_mode == "default"
    cfg = load_run_config(SMOKE, ["train.compile_mode=max-autotune-no-cudagraphs"])
    assert cfg.train.compile_mode == "max-autotune-no-cudagraphs"
    resolved = tmp_path / "config.yaml"
    resolved.write_text(dump(cfg))
    assert load_run_config(resolved) == cfg


def test_bad_compile_mode_names_the_key():
    with pytest.raises(ValueError, match=r"train\.compile_mode.*'turbo'"):
        load_run_config(SMOKE, ["train.compile_mode=turbo"])
    with pytest.raises(ValueError, match=r"train\.compile_mode='turbo' must be one of \['default'"):
        TrainConfig(compile_mode="turbo")
    assert set(COMPILE_MODES) == {"default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"}


def test_reduce_overhead_compiles_and_matches_eager_on_cpu():
    cfg = load_run_config(SMOKE, ["train.compile=on", "train.compile_mode=reduce-overhead",
                                  "train.compile_probe_steps=1"])
    torch.manual_seed(0)
    # one conv-BatchNorm-LeakyReLU stage of unet_3d plus a 1x1x1 head: few kernels, so a cold inductor cache
    # compiles in seconds on 2 cores (the whole tiny unet_3d takes about 40 s)
    model = nn.Sequential(conv_stage(3, 1, out_channels=4, norm="batch", num_convs=1),
                          nn.Conv3d(4, cfg.data.num_target_channels, kernel_size=1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    net, record, _ = maybe_compile(model, cfg, torch.device("cpu"), precision="fp32", fmt=torch.contiguous_format,
                                batch=2)
    assert record["compiled"] is True and record["compile_mode"] == "reduce-overhead"
    assert net is not model
    # the probe steps leave weights and BatchNorm statistics untouched
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    image_BCZYX = torch.rand(2, 1, *cfg.data.patch_shape_vox)  # the probe's shape: no recompilation
    logits_BKZYX = net(image_BCZYX)
    torch.testing.assert_close(logits_BKZYX, model(image_BCZYX), rtol=1e-4, atol=1e-4)
    logits_BKZYX.square().mean().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_meta_json_records_compile_mode(tiny_synth_root, tmp_path):
    run = tmp_path / "run"
    train(load_run_config(SMOKE, [f"data.root={tiny_synth_root}", f"run_dir={run}", "train.max_steps=1",
                                  "train.compile_mode=max-autotune"]))
    meta = json.loads((run / "meta.json").read_text())
    assert meta["compile"]["compile_mode"] == "max-autotune" and meta["compile"]["compiled"] is False  # compile off


STATIC_CHECK_BACKEND = "cellseg_test_static_check"
_graph_static: list[bool] = []  # per graph the test backend received: no symbolic size among its inputs


def _record_static(gm: torch.fx.GraphModule, example_inputs: list) -> object:
    values = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    _graph_static.append(not any(isinstance(v, torch.SymInt) or (torch.is_tensor(v) and any(
        isinstance(d, torch.SymInt) for d in v.shape)) for v in values))
    return gm.forward  # runs the traced graph as it is: dynamo's tracing decides the shapes, not this backend


if STATIC_CHECK_BACKEND not in torch._dynamo.list_backends(exclude_tags=()):
    torch._dynamo.register_backend(_record_static, name=STATIC_CHECK_BACKEND)


def test_training_compiles_static_shapes_after_the_same_forward_was_compiled_for_others(monkeypatch):
    """Dynamo keeps one cache per code object: once `SegModel.forward` ran compiled for another shape in this
    process (inference, a notebook), a new compile would trace with symbolic sizes. The trainer's does not."""
    from cellseg.train.build import make_model

    monkeypatch.setenv("CELLSEG_COMPILE_BACKEND", STATIC_CHECK_BACKEND)
    cfg = load_run_config(SMOKE, ["train.compile=on", "train.compile_probe_steps=1"])
    torch.manual_seed(0)
    model = make_model(cfg, torch.device("cpu"), torch.contiguous_format)
    with torch.no_grad():
        # another shape first, compiled as anyone may in the same process (torch's default: dynamic=None)
        torch.compile(model, backend=STATIC_CHECK_BACKEND)(torch.rand(1, 1, 16, 16, 16))
    _graph_static.clear()
    net, record, _ = maybe_compile(model, cfg, torch.device("cpu"), precision="fp32", fmt=torch.contiguous_format,
                                   batch=2)
    assert record["compiled"] is True and net is not model
    assert _graph_static and all(_graph_static), _graph_static
