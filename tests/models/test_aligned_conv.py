"""Input convolutions that pad their channels in a channels-last model compute what unpadded ones do."""

import pytest
import torch
from torch import nn

from cellseg.models import build_model
from cellseg.models.blocks import AlignedConv2d, AlignedConv3d, conv_norm_act, set_channels_last


@pytest.mark.parametrize("dims", [2, 3])
def test_padded_input_conv_matches_the_plain_convolution(dims):
    torch.manual_seed(0)
    conv = conv_norm_act(dims, 1, out_channels=4, norm="batch").conv
    assert isinstance(conv, AlignedConv3d if dims == 3 else AlignedConv2d)
    plain = (nn.Conv3d if dims == 3 else nn.Conv2d)(1, 4, 3, padding=1, bias=False)
    plain.load_state_dict(conv.state_dict())
    fmt = torch.channels_last_3d if dims == 3 else torch.channels_last
    image = torch.rand((2, 1, *[7] * dims)).contiguous(memory_format=fmt)
    set_channels_last(conv, True)
    out, want = conv(image), plain(image)
    torch.testing.assert_close(out, want)
    assert out.is_contiguous(memory_format=fmt)
    out.square().sum().backward()
    want.square().sum().backward()
    assert conv.weight.grad.shape == conv.weight.shape == (4, 1, *[3] * dims)
    torch.testing.assert_close(conv.weight.grad, plain.weight.grad)


def test_only_narrow_inputs_are_aligned_and_the_parameters_keep_their_names():
    assert type(conv_norm_act(3, 8, out_channels=4, norm="batch").conv) is nn.Conv3d
    block = conv_norm_act(3, 1, out_channels=4, norm="batch")
    assert "conv.weight" in block.state_dict()


def test_a_channels_last_unet_gives_the_same_logits_padded_or_not():
    torch.manual_seed(0)
    model = build_model("unet_3d", 1, 3, preset="tiny").eval().to(memory_format=torch.channels_last_3d)
    image = torch.rand((1, 1, 16, 16, 16)).contiguous(memory_format=torch.channels_last_3d)
    with torch.no_grad():
        plain = model(image)
        padded = set_channels_last(model, True)(image)
    torch.testing.assert_close(padded, plain)
