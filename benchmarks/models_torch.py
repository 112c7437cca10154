"""The benchmark models in PyTorch: the same four as models.h (see there), with torch.nn's
default initialisation (kaiming-uniform, a = sqrt(5)).

  simple   [B, 3, 32, 32]: conv 3->64 (3x3) relu pool2 | fc 14400->10
  fashion  [B, 1, 28, 28]: conv 1->32 pad1 relu pool2 | conv 32->64 pad1 relu pool2 | fc 3136->128 relu | fc 10
  vgg      [B, 3, 32, 32]: [conv 32, conv 32, pool] [conv 64, conv 64, pool] [conv 128, pool] | fc 2048->10
  resnet   [B, 1, 28, 28]: ResNet-20 of examples/resnet.cpp (galley/models/resnet.h): ResNet below

ResNet mirrors galley::models::ResNet module for module, under the same state names, so a
state_dict moves between the two; the parity suite (tests/parity/make_reference.py) uses it too.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = ("simple", "fashion", "vgg", "resnet")
INPUT = {"simple": (3, 32, 32), "fashion": (1, 28, 28), "vgg": (3, 32, 32), "resnet": (1, 28, 28)}


class BasicBlock(nn.Module):
    """conv3x3 (stride) bn relu conv3x3 bn, plus the shortcut (identity, or a 1x1 conv and a bn
    where the shape changes), then relu."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.projects = stride != 1 or cin != cout
        if self.projects:
            self.shortcut_conv = nn.Conv2d(cin, cout, 1, stride=stride, bias=False)
            self.shortcut_bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        h = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(h + (self.shortcut_bn(self.shortcut_conv(x)) if self.projects else x))


class ResNet(nn.Module):
    """A CIFAR-style ResNet: 3x3 stem, `stages` stages of `blocks` basic blocks (channels
    width, 2 width, ...; stride 2 at the start of every stage after the first), global average
    pooling and a linear layer."""

    def __init__(self, in_channels=3, num_classes=10, width=16, stages=3, blocks=3):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.names = []
        cin = width
        for stage in range(stages):
            cout = width << stage
            for b in range(blocks):
                name = f"layer{stage + 1}_{b}"
                self.add_module(name, BasicBlock(cin, cout, 2 if stage > 0 and b == 0 else 1))
                self.names.append(name)
                cin = cout
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        h = F.relu(self.bn(self.conv(x)))
        for name in self.names:
            h = getattr(self, name)(h)
        return self.fc(torch.flatten(self.pool(h), 1))


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
    elif name == "resnet":
        return ResNet(in_channels=1), INPUT[name]
    else:
        raise ValueError(f"unknown model {name!r} ({', '.join(MODELS)})")
    return nn.Sequential(*layers), INPUT[name]
