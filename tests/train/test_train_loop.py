"""The classification training loop: exact resume from an epoch checkpoint, atomic checkpoints, sparsity, errors."""

from __future__ import annotations

import math

import pytest
import torch
from _classify_factories import tiny_bn_cnn

import prunefx._io
from prunefx.data.classification import DatasetSpec, TensorSplit, load_dataset
from prunefx.train import SparsityConfig
from prunefx.train.loop import TrainConfig, TrainError, augment_batch, evaluate, fit, lr_factor


@pytest.fixture(scope="module")
def digits():
    d = load_dataset(DatasetSpec(name="digits", image_size=8))
    return TensorSplit(d.train.images[:384], d.train.labels[:384]), d.val


def _model():
    torch.manual_seed(0)
    return tiny_bn_cnn(10, 1)


CFG = TrainConfig(epochs=3, batch=64, lr=0.05, warmup_epochs=0.5, augment=("crop", "flip"), label_smoothing=0.1)


class Stop(Exception):
    pass


def test_resume_continues_exactly_like_an_uninterrupted_run(digits, tmp_path):
    train, val = digits
    straight = _model()
    full = fit(straight, train, CFG, val=val, checkpoint=tmp_path / "a.pt", log=lambda _: None)

    def interrupt(epoch, row):
        if epoch == 1:
            raise Stop

    cut = _model()
    with pytest.raises(Stop):
        fit(cut, train, CFG, val=val, checkpoint=tmp_path / "b.pt", log=lambda _: None, on_epoch=interrupt)
    assert torch.load(tmp_path / "b.pt", weights_only=True)["epoch"] == 2
    resumed_model = _model()  # a fresh process would start from a fresh model
    resumed = fit(resumed_model, train, CFG, val=val, checkpoint=tmp_path / "b.pt", log=lambda _: None)
    assert resumed.resumed_from == 2 and len(resumed.history) == 3
    for k, v in straight.state_dict().items():
        assert torch.equal(v, resumed_model.state_dict()[k]), k
    assert [r["loss"] for r in resumed.history] == [r["loss"] for r in full.history]
    assert full.history[-1]["loss"] < full.history[0]["loss"] and "val_top1" in full.history[-1]


def test_resume_refuses_another_recipe_and_a_damaged_file(digits, tmp_path):
    train, _ = digits
    path = tmp_path / "last.pt"
    fit(_model(), train, TrainConfig(epochs=1, lr=0.05), checkpoint=path, log=lambda _: None)
    with pytest.raises(TrainError, match=r"another recipe \(lr: 0.05 -> 0.1\)"):
        fit(_model(), train, TrainConfig(epochs=2, lr=0.1), checkpoint=path, log=lambda _: None)
    with pytest.raises(TrainError, match="do not fit this model"):
        fit(tiny_bn_cnn(10, 3), train, TrainConfig(epochs=2, lr=0.05), checkpoint=path, log=lambda _: None)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(TrainError, match="delete it to restart"):
        fit(_model(), train, TrainConfig(epochs=2, lr=0.05), checkpoint=path, log=lambda _: None)


def test_a_failed_checkpoint_write_keeps_the_previous_epoch(digits, tmp_path, monkeypatch):
    train, _ = digits
    path = tmp_path / "last.pt"
    calls = []

    def fsync_fails_on_second_save(fd):
        calls.append(fd)
        if len(calls) == 2:
            raise OSError("disk full")

    monkeypatch.setattr(prunefx._io.os, "fsync", fsync_fails_on_second_save)
    with pytest.raises(OSError, match="disk full"):
        fit(_model(), train, TrainConfig(epochs=3, lr=0.05), checkpoint=path, log=lambda _: None)
    state = torch.load(path, weights_only=True)  # still the whole epoch-1 checkpoint
    assert state["epoch"] == 1 and set(state) >= {"model", "optimizer", "history"}
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temp file left behind


def test_sparsity_drives_bn_gammas_down(digits):
    train, _ = digits
    cfg = TrainConfig(epochs=2, lr=0.05)
    plain, sparse = _model(), _model()
    fit(plain, train, cfg, log=lambda _: None)
    result = fit(sparse, train, cfg, sparsity=SparsityConfig(s=3e-2), log=lambda _: None)

    def gammas(m: torch.nn.Module) -> torch.Tensor:
        return torch.cat([b.weight.detach().abs() for b in m.modules() if isinstance(b, torch.nn.BatchNorm2d)])

    # Same seed, same batches: the only difference is the L1 pull (about sum(lr) * s * momentum gain here).
    assert gammas(sparse).median() < gammas(plain).median() - 0.02
    assert result.sparsity["bn_channels"] == 144 and "sparsity_s" in result.history[-1]


def test_divergence_is_a_clear_error(digits):
    train, _ = digits
    with pytest.raises(TrainError, match=r"loss became .* lower lr"):
        fit(_model(), train, TrainConfig(epochs=1, lr=1e8, momentum=0.0), log=lambda _: None)


def test_evaluate_counts_top1_top5_exactly():
    class Fixed(torch.nn.Module):
        def forward(self, x):
            return x.flatten(1)

    logits = torch.tensor([[5.0, 4, 3, 2, 1, 0], [0, 1, 2, 3, 4, 5], [0, 5, 1, 1, 1, 1]])
    split = TensorSplit(logits, torch.tensor([0, 0, 1]))  # top-1 hits: rows 0 and 2; top-5 misses row 1 only
    m = evaluate(Fixed(), split, batch=2)
    assert (m.top1, m.top5, m.n) == (2 / 3, 2 / 3, 3)


def test_lr_schedule_and_augmentation():
    cfg = TrainConfig(lr=1.0, schedule="cosine")
    assert lr_factor(0, 100, 10, cfg) == pytest.approx(0.1) and lr_factor(10, 100, 10, cfg) == 1.0
    assert lr_factor(100, 100, 10, cfg) == pytest.approx(0.0, abs=1e-12)
    step = TrainConfig(schedule="step", lr_steps=(0.5,), lr_gamma=0.1)
    assert lr_factor(49, 100, 0, step) == 1.0 and lr_factor(50, 100, 0, step) == pytest.approx(0.1)
    x = torch.arange(2 * 1 * 4 * 4, dtype=torch.float32).reshape(2, 1, 4, 4)
    out = augment_batch(x, TrainConfig(augment=("crop",), crop_pad=1), torch.Generator().manual_seed(0))
    assert out.shape == x.shape
    for i in range(2):  # each image is its own shifted copy: interior values come from the same image
        assert set(out[i].unique().tolist()) - {0.0} <= set(x[i].unique().tolist())
    again = augment_batch(x, TrainConfig(augment=("crop",), crop_pad=1), torch.Generator().manual_seed(0))
    assert torch.equal(out, again)
    flipped = augment_batch(x, TrainConfig(augment=("flip",)), torch.Generator().manual_seed(1))
    assert all(torch.equal(flipped[i], x[i]) or torch.equal(flipped[i], x[i].flip(-1)) for i in range(2))


def test_bad_settings_name_the_key():
    with pytest.raises(TrainError, match=r"optimizer must be one of 'sgd', 'adamw', got 'adam' \(did you mean"):
        TrainConfig(optimizer="adam")
    with pytest.raises(TrainError, match=r"prune.finetune.lr must be a number, got 'fast'"):
        TrainConfig().updated({"lr": "fast"}, "prune.finetune.")
    with pytest.raises(TrainError, match=r"augment\[0\] must be one of 'crop', 'flip', got 'rotate'"):
        TrainConfig.from_dict({"augment": ["rotate"]})
    assert TrainConfig.from_dict({"lr": "1e-3", "augment": "flip"}).augment == ("flip",)
    assert math.isclose(TrainConfig.from_dict({"lr": "1e-3"}).lr, 1e-3)
