"""Model factories for ``package.module:factory`` SPECs in the CLI and load_spec tests."""

import torch
from torch import nn

import prunefx


def tiny_cnn() -> nn.Module:
    """conv -> BN -> ReLU -> conv -> pool -> linear: two prunable groups, fast to analyze, measure and time."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )  # fmt: skip


def gray_cnn() -> nn.Module:
    """A single-channel model: its forward rejects the RGB batch load_spec builds for a factory."""
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten())


class _Gated(nn.Module):
    def forward(self, x):
        return x if x.sum() > 0 else -x  # control flow on tensor values: torch.fx cannot trace it


def untraceable() -> nn.Module:
    """A model whose root forward branches on data: analyze fails with a (multi-line) TraceFailure."""
    return _Gated()


def not_a_module() -> dict:
    return {"conv": nn.Conv2d(3, 3, 1)}


def broken() -> nn.Module:
    raise RuntimeError("no weights for this architecture")


LAYER = nn.Conv2d(3, 3, 1)  # a module instance, not a factory


class Noise(nn.Module):
    """Random in eval mode (an opaque leaf): no pruned copy can equal its masked original."""

    def forward(self, x):
        return x + 0.1 * torch.randn_like(x)


def noisy_cnn() -> nn.Module:
    """tiny_cnn followed by Noise: prunefx prune must refuse it (VerificationError) and write no model."""
    prunefx.register_leaf(Noise)
    return nn.Sequential(tiny_cnn(), Noise())


def long_names() -> nn.Module:
    """tiny_cnn's layers under long nested names: its member labels are longer than an 80-column line."""
    stage = nn.Sequential()
    stage.add_module("first_convolution_with_a_long_descriptive_name", nn.Conv2d(3, 8, 3, padding=1))
    stage.add_module("batch_normalisation_after_the_first_convolution", nn.BatchNorm2d(8))
    stage.add_module("activation", nn.ReLU())
    stage.add_module("second_convolution_with_a_long_descriptive_name", nn.Conv2d(8, 16, 3, stride=2))
    model = nn.Sequential()
    model.add_module("encoder_stage_number_one_of_the_feature_extractor", stage)
    model.add_module("pool", nn.AdaptiveAvgPool2d(1))
    model.add_module("flatten", nn.Flatten())
    model.add_module("classifier_head_projecting_to_the_ten_classes", nn.Linear(16, 10))
    return model


def scaled_cnn() -> nn.Module:
    """Two Conv-BN-ReLU blocks whose BatchNorm gammas differ ~50x in scale: raw bn_scale scores are not comparable."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )  # fmt: skip
    with torch.no_grad():  # distinct gammas (no ties), the second layer's 50x smaller
        model[1].weight.uniform_(0.2, 1.2)
        model[4].weight.uniform_(0.004, 0.024)
    return model


def frames_cnn() -> nn.Module:
    """A 1-D conv net on raw samples (1 x 1 x L): its input is not an image."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(1, 16, 9, stride=4), nn.BatchNorm1d(16), nn.ReLU(), nn.Conv1d(16, 32, 5, stride=2),
                         nn.BatchNorm1d(32), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(32, 8))


class _TokenMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.fc1, self.fc2 = nn.Embedding(16, 32), nn.Linear(32, 64), nn.Linear(64, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(self.emb(ids))))


def token_mlp() -> nn.Module:
    """Token ids in (int64, vocabulary 16), logits out."""
    torch.manual_seed(0)
    return _TokenMLP()


class TwoTower(nn.Module):
    """Token ids and an image, each optional and taken by name (an HF-style forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.img = nn.Embedding(16, 8), nn.Conv2d(3, 8, 3, padding=1)
        self.mlp = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8))
        self.head = nn.Linear(8, 4)

    def forward(self, input_ids=None, attention_mask=None, pixel_values=None):
        h = 0
        if input_ids is not None:
            e = self.emb(input_ids)
            if attention_mask is not None:
                e = e * attention_mask[..., None]
            h = h + e.mean(1)
        if pixel_values is not None:
            h = h + self.img(pixel_values).mean((2, 3))
        return self.head(h + self.mlp(h))


def two_tower() -> nn.Module:
    torch.manual_seed(0)
    return TwoTower().eval()


def keyword_inputs() -> dict:
    return {"pixel_values": torch.rand(2, 3, 8, 8), "input_ids": torch.randint(0, 16, (2, 5))}


def not_inputs() -> int:
    return 3


def inputs_that_raise() -> dict:
    raise ValueError("no data here")
