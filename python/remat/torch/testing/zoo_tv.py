"""torchvision's image classifiers, as torchvision builds them, at small
sizes (32x32 images, a batch of two, ten classes), randomly initialised
(nothing is downloaded), for the tests and the sweep (bench/torch_zoo.py
--tv): residual and inverted-residual blocks with batch norm and in-place
activations, squeeze-and-excitation, stochastic depth, channel shuffles,
dense concatenations (one with torchvision's own checkpointing), a
ConvNeXt's permutes and layer scale, a vision transformer, Swin's shifted
windows, MaxViT's grid attention. Each `make(seed, device="cpu")` returns
(model, step) as remat.torch.testing.zoo's do. Needs torchvision (pip install
torchvision)."""
import functools

import torch
import torch.nn.functional as F
from torchvision import models as tvm

CLASSES = 10


def _classifier(build, seed, device, image=32):
    torch.manual_seed(seed)
    m = build(num_classes=CLASSES).to(device)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, image, image, generator=g).to(device)
    y = torch.tensor([1, 7]).to(device)

    def step():
        return F.cross_entropy(m(x), y)
    return m, step


def _maker(name, build, image=32):
    def make(seed, device="cpu"):
        return _classifier(build, seed, device, image)
    make.__name__ = name
    return make


_BUILDS = [
    ("resnet18", tvm.resnet18, 32),
    ("mobilenet_v3", tvm.mobilenet_v3_small, 32),
    ("efficientnet", tvm.efficientnet_b0, 32),
    ("shufflenet", tvm.shufflenet_v2_x0_5, 32),
    ("squeezenet", tvm.squeezenet1_1, 48),
    # memory_efficient: each dense layer's concatenation and bottleneck run
    # under torch.utils.checkpoint.
    ("densenet", functools.partial(tvm.DenseNet, growth_rate=8, block_config=(2, 2),
                                   num_init_features=16, memory_efficient=True), 32),
    ("convnext", functools.partial(
        tvm.ConvNeXt, [tvm.convnext.CNBlockConfig(16, 32, 1),
                       tvm.convnext.CNBlockConfig(32, None, 1)],
        stochastic_depth_prob=0.2), 32),
    ("vision_transformer", functools.partial(
        tvm.VisionTransformer, image_size=32, patch_size=8, num_layers=2, num_heads=2,
        hidden_dim=16, mlp_dim=32, dropout=0.1), 32),
    ("swin", functools.partial(tvm.SwinTransformer, patch_size=[4, 4], embed_dim=16,
                               depths=[1, 1], num_heads=[2, 2], window_size=[2, 2],
                               stochastic_depth_prob=0.2), 32),
    ("maxvit", functools.partial(tvm.MaxVit, input_size=(32, 32), stem_channels=8,
                                 partition_size=2, block_channels=[16, 32], block_layers=[1, 1],
                                 head_dim=8, stochastic_depth_prob=0.2), 32),
]

TV = {name: _maker(name, build, image) for name, build, image in _BUILDS}
