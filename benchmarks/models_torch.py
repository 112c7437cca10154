"""The benchmark models in PyTorch: the same three as models.h (see there), with torch.nn's
default initialisation (kaiming-uniform, a = sqrt(5)).

  simple   [B, 3, 32, 32]: conv 3->64 (3x3) relu pool2 | fc 14400->10
  fashion  [B, 1, 28, 28]: conv 1->32 pad1 relu pool2 | conv 32->64 pad1 relu pool2 | fc 3136->128 relu | fc 10
  vgg      [B, 3, 32, 32]: [conv 32, conv 32, pool] [conv 64, conv 64, pool] [conv 128, pool] | fc 2048->10
"""
import torch.nn as nn

MODELS = ("simple", "fashion", "vgg")
INPUT = {"simple": (3, 32, 32), "fashion": (1, 28, 28), "vgg": (3, 32, 32)}


def _conv(cin, cout, pad):
    return nn.Conv2d(cin, cout, 3, padding=pad)


def build(name):
    """Returns (model, input shape of one sample)."""
    if name == "simple":
        layers = [_conv(3, 64, 0), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(1), nn.Linear(64 * 15 * 15, 10)]
    elif name == "fashion":
        layers = [_conv(1, 32, 1), nn.ReLU(), nn.MaxPool2d(2), _conv(32, 64, 1), nn.ReLU(), nn.MaxPool2d(2),
                  nn.Flatten(1), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10)]
    elif name == "vgg":
        layers = [_conv(3, 32, 1), nn.ReLU(), _conv(32, 32, 1), nn.ReLU(), nn.MaxPool2d(2),
                  _conv(32, 64, 1), nn.ReLU(), _conv(64, 64, 1), nn.ReLU(), nn.MaxPool2d(2),
                  _conv(64, 128, 1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(1), nn.Linear(128 * 4 * 4, 10)]
    else:
        raise ValueError(f"unknown model {name!r} ({', '.join(MODELS)})")
    return nn.Sequential(*layers), INPUT[name]
