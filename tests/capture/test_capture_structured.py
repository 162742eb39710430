"""What a detector's forward asks of the tracer, one pattern per test: a list of images as input, a forward that
cannot be traced in training mode, rows of a tensor iterated, in-place writes, type checks, cached helper objects,
decisions on data-dependent sizes, and library functions recorded as one node."""

from __future__ import annotations

import operator
import sys

import torch
import torch.fx as fx
from torch import nn

import prunefx
from prunefx.capture import capture_info, register_leaf_function, trace


class ListDetector(nn.Module):
    """A list of images in, a list of dicts out; training needs targets (asserted, as torchvision detectors do)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.body = nn.Conv2d(8, 6, 3, padding=1)
        self.head = nn.Conv2d(6, 2, 1)

    def forward(self, images: list[torch.Tensor], targets: list[dict] | None = None) -> list[dict]:
        if self.training:
            torch._assert(targets is not None, "targets should not be none when in training mode")
        sizes = [img.shape[-2:] for img in images]  # a Python loop over the list
        batch = images[0].new_zeros((len(images), 3, *sizes[0]))
        for i, img in enumerate(images):
            batch[i] = img  # an in-place write into the batch
        scores = self.head(torch.relu(self.body(self.stem(batch))))
        out = []
        for s in scores:  # one row per image
            out.append({"mean": s.mean(dim=(1, 2)), "top": s.flatten().topk(3).values})
        return out


def _images() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.rand(3, 8, 8, generator=g), torch.rand(3, 8, 8, generator=g)]


def test_a_list_of_images_gets_one_placeholder_per_image_and_the_graph_takes_the_list():
    model, images = ListDetector().eval(), _images()
    gm = trace(model, (images,), training=False)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 2 and not capture_info(gm).auto_leaves
    assert any(n.target is operator.setitem for n in gm.graph.nodes)  # the in-place write is in the graph
    got, want = gm(images), model(images)
    assert len(got) == len(want) == 2
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a["mean"], b["mean"])
        torch.testing.assert_close(a["top"], b["top"])


def test_a_forward_that_needs_targets_in_training_is_analysed_in_eval_mode_and_says_so():
    model, images = ListDetector().eval(), _images()
    dg = prunefx.analyze(model, (images,))
    assert dg.training is False and dg.capture == "fx"
    assert len(dg.notes) == 1 and "traced in evaluation mode" in dg.notes[0]
    assert "targets should not be none when in training mode" in dg.notes[0]
    assert "note: traced in evaluation mode" in dg.summary()
    (stem,) = dg.groups_of("stem.0")
    assert stem.prunable and {m.name for m in stem.members if m.kind.value == "module"} == {"stem.0", "stem.1",
                                                                                         "body"}
    (body,) = dg.groups_of("body")
    assert body.prunable and {m.name for m in body.members if m.kind.value == "module"} == {"body", "head"}
    assert all(m.training is False for m in [model, *model.modules()])  # flags restored (it was in eval)
    result = prunefx.prune(model, (images,), prunefx.PlanConfig(ratio=0.5), criterion="l1")
    assert result.verified.ok, result.verified.message
    assert result.model.stem[0].out_channels < 8 and result.model.body.out_channels < 6  # both groups pruned


def test_a_model_in_training_mode_keeps_its_flags_after_the_eval_mode_fallback():
    model, images = ListDetector().train(), _images()
    prunefx.analyze(model, (images,))
    assert all(m.training for m in model.modules())


class Decisions(nn.Module):
    """isinstance on an activation, a helper object cached on the first forward, a branch on a data-dependent size."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.helper: Helper | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        torch._assert(isinstance(y, torch.Tensor), "expects a tensor")  # as torchvision's box coder asserts
        if self.helper is None:
            self.helper = Helper(2.0)
        y = scaled(y, self.helper)
        kept = (x.flatten() > 0.5).nonzero()  # its size depends on the data
        if kept.shape[0] > 0:  # decided on the example inputs
            y = y + 1
        return y


class Helper:
    def __init__(self, k: float) -> None:
        self.k = k


def scaled(y: torch.Tensor, helper: Helper) -> torch.Tensor:
    return y * helper.k


def test_type_checks_cached_helpers_and_data_dependent_sizes_are_followed():
    model, x = Decisions().eval(), torch.rand(1, 3, 4, 4)
    model(x)  # caches the helper object: the trace gets it as an argument
    register_leaf_function(sys.modules[__name__], "scaled")
    gm = trace(model, (x,), training=False)
    assert not capture_info(gm).auto_leaves
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is scaled]
    assert len(calls) == 1  # recorded as one node, its helper a constant of the graph
    assert isinstance(calls[0].args[1], fx.Node) and calls[0].args[1].op == "get_attr"
    assert not hasattr(model, calls[0].args[1].target)  # the constant lives on the graph, not on the model
    assert any(v is True for v in capture_info(gm).specialised.values())  # the data-dependent branch
    torch.testing.assert_close(gm(x), model(x))


def test_split_with_traced_sizes_has_one_piece_per_size():
    class Split(nn.Module):
        def forward(self, x):
            sizes = [x.shape[0] // 2, x.shape[0] - x.shape[0] // 2]
            a, b = x.split(sizes, 0)
            return a.sum() - b.sum()

    x = torch.rand(5, 3)
    gm = trace(Split(), (x,))
    torch.testing.assert_close(gm(x), Split()(x))
