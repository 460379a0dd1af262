"""Two layout options for `unet_3d`'s training step, each timed alone against what the trainer does now.

    python -m bench.step_layouts --out OUT                  # one GPU, seconds
    python -m bench.step_layouts --quick --out OUT          # CPU, 2 × 16³, seconds (checks the script)

- **Head**: the 58-channel output head (a 1×1×1 convolution from 32 channels) as is, vs padded to 64 output
  channels and sliced back to 58; forward, BCE with logits and backward on a (B, 32, Z, Y, X) bf16 channels-last
  input, eager and compiled. cuDNN pads odd channel counts itself, in kernels of their own.
- **Decode**: the class-table decode of the targets (`cellseg.data.augment._rows`: each voxel's label id picks its
  row of the per-sample table, one byte per element) vs gathering whole 8-byte rows of the table padded to 64
  channels and viewing them as bool (a strided view of 58 of 64 channels), alone and made contiguous. The two
  results are asserted equal.

Shapes: batch 8 × 128³, 58 channels, 256 label ids (the trainer's `unet_3d` batch); `--quick` 2 × 16³.
Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.record import record_stem
from bench.train_step import timed
from cellseg.data.augment import _rows

CHANNELS, PADDED, FEATURES, IDS = 58, 64, 32, 256  # unet_3d's output channels, a multiple of 8 and 64 bytes
WARMUP = 5  # untimed calls first (compilation, cuDNN's algorithm search)


def head_ms(batch: int, size: int, device: torch.device, steps: int) -> dict[str, float]:
    """Milliseconds per forward + BCE + backward of the head, as is and padded, eager and compiled."""
    fmt = torch.channels_last_3d
    features_BFZYX = torch.randn(batch, FEATURES, size, size, size, device=device, dtype=torch.bfloat16)
    features_BFZYX = features_BFZYX.contiguous(memory_format=fmt).requires_grad_()
    weight = torch.randn(CHANNELS, FEATURES, 1, 1, 1, device=device, requires_grad=True)
    bias = torch.zeros(CHANNELS, device=device, requires_grad=True)
    target_BCZYX = torch.rand(batch, CHANNELS, size, size, size, device=device).to(torch.bfloat16)
    target_BCZYX = target_BCZYX.contiguous(memory_format=fmt)

    def as_is(features: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, torch.bfloat16):
            logits = F.conv3d(features, weight, bias)
        return F.binary_cross_entropy_with_logits(logits.float(), target_BCZYX.float())

    def padded(features: torch.Tensor) -> torch.Tensor:
        extra = PADDED - CHANNELS  # zero filters after the 58: sliced off before the loss
        with torch.autocast(device.type, torch.bfloat16):
            logits = F.conv3d(features, F.pad(weight, (0, 0, 0, 0, 0, 0, 0, 0, 0, extra)), F.pad(bias, (0, extra)))
        return F.binary_cross_entropy_with_logits(logits[:, :CHANNELS].float(), target_BCZYX.float())

    out = {}
    for name, loss in (("as_is", as_is), ("padded", padded)):
        for how, fn in (("eager", loss), ("compiled", torch.compile(loss, dynamic=False))):
            def step(fn=fn) -> None:
                fn(features_BFZYX).backward()

            out[f"{name}_{how}_ms"] = 1e3 * timed(step, steps, WARMUP, device)[0]
    return out


def decode_ms(batch: int, size: int, device: torch.device, steps: int) -> dict[str, float]:
    """Milliseconds per decode of a (batch, size³) uint8 id volume through a (batch, 256, 58) bool table."""
    generator = torch.Generator().manual_seed(0)
    ids_BZYX = torch.randint(0, IDS, (batch, size, size, size), dtype=torch.uint8, generator=generator).to(device)
    table_BVC = (torch.rand(batch, IDS, CHANNELS, generator=generator) < 0.1).to(device)  # a tenth of bits set
    rows_BV8 = F.pad(table_BVC, (0, PADDED - CHANNELS)).contiguous().view(torch.int64)  # 64 bools = one int64

    def one_byte() -> torch.Tensor:
        return _rows(table_BVC, ids_BZYX)

    def eight_bytes() -> torch.Tensor:
        index = ids_BZYX.reshape(batch, -1, 1).long().expand(-1, -1, rows_BV8.shape[-1])
        return torch.gather(rows_BV8, 1, index).view(torch.bool)[..., :CHANNELS]

    if not torch.equal(one_byte(), eight_bytes()):
        raise AssertionError("the 8-byte-row decode differs from the trainer's")
    return {"one_byte_rows_ms": 1e3 * timed(one_byte, steps, WARMUP, device)[0],
            "eight_byte_rows_ms": 1e3 * timed(eight_bytes, steps, WARMUP, device)[0],
            "eight_byte_rows_contiguous_ms": 1e3 * timed(lambda: eight_bytes().contiguous(), steps, WARMUP,
                                                         device)[0]}


def markdown(result: dict) -> str:
    env, head, dec = result["env"], result["head"], result["decode"]
    return "\n".join([
        f"# unet_3d step layouts ({env['gpu']}, torch {env['torch']}, {env['date']})", "",
        f"Batch {env['batch']} × {env['size']}³, {CHANNELS} channels; ms per call, mean of {env['head_steps']} "
        f"(head) and {env['decode_steps']} (decode) after {WARMUP}.", "",
        "| head (forward + BCE + backward) | eager ms | compiled ms |", "|---|---|---|",
        f"| {CHANNELS} channels (as now) | {head['as_is_eager_ms']:.2f} | {head['as_is_compiled_ms']:.2f} |",
        f"| padded to {PADDED}, sliced back | {head['padded_eager_ms']:.2f} | {head['padded_compiled_ms']:.2f} |", "",
        "| class-table decode | ms |", "|---|---|",
        f"| one byte per element (as now) | {dec['one_byte_rows_ms']:.2f} |",
        f"| 8-byte rows, strided view | {dec['eight_byte_rows_ms']:.2f} |",
        f"| 8-byte rows, made contiguous | {dec['eight_byte_rows_contiguous_ms']:.2f} |", ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="output stem: OUT.json and OUT.md (default: bench/results/step_layouts_<hardware>)")
    parser.add_argument("--head-steps", type=int, default=20, help="timed calls per head variant (default 20)")
    parser.add_argument("--decode-steps", type=int, default=50, help="timed calls per decode variant (default 50)")
    parser.add_argument("--quick", action="store_true", help="CPU, 2 × 16³, 2 calls each (checks the script)")
    args = parser.parse_args(argv)
    if args.quick:
        device, batch, size, args.head_steps, args.decode_steps = torch.device("cpu"), 2, 16, 2, 2
    elif torch.cuda.is_available():
        device, batch, size = torch.device("cuda"), 8, 128
        torch.backends.cudnn.benchmark = True  # as training runs
    else:
        parser.error("needs a CUDA GPU (or --quick)")
    env = {"gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
           "date": datetime.date.today().isoformat(), "batch": batch, "size": size,
           "head_steps": args.head_steps, "decode_steps": args.decode_steps}
    result = {"benchmark": "step_layouts", "env": env, "decode": decode_ms(batch, size, device, args.decode_steps),
              "head": head_ms(batch, size, device, args.head_steps)}
    args.out = args.out or record_stem("step_layouts")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
