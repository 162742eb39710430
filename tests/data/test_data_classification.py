"""Classification datasets: digits splits, the synthetic set, ImageFolder/CIFAR on disk, and their errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from prunefx.data import classification as C
from prunefx.data.classification import DatasetError, DatasetSpec, load_dataset
from prunefx.data.synthetic import CLASSES, make_synthetic


def test_digits_splits_are_disjoint_complete_seeded_and_normalised():
    a = load_dataset(DatasetSpec(name="digits", image_size=16, seed=0))
    b = load_dataset(DatasetSpec(name="digits", image_size=16, seed=0))
    c = load_dataset(DatasetSpec(name="digits", image_size=16, seed=1))
    assert (len(a.train), len(a.val), len(a.test)) == (1257, 270, 270)  # 70/15/15 of 1,797
    assert a.train.images.shape[1:] == (1, 16, 16) and a.num_classes == 10 and a.channels == 1
    # Disjoint and complete: every image lands in exactly one split (compare rows, since order is shuffled).
    rows = {tuple(x.flatten().tolist()) for split in (a.train, a.val, a.test) for x in split.images}
    assert len(rows) >= 1797 - 20  # digits has a handful of exact duplicate images
    assert torch.equal(a.test.images, b.test.images) and torch.equal(a.test.labels, b.test.labels)
    assert not torch.equal(a.test.labels, c.test.labels)
    # Normalised with the training split's own statistics.
    assert abs(a.train.images.mean().item()) < 1e-4 and abs(a.train.images.std().item() - 1) < 1e-3
    assert set(a.test.labels.tolist()) == set(range(10))


def test_digits_as_rgb_for_torchvision_models():
    d = load_dataset(DatasetSpec(name="digits", image_size=32, channels=3))
    x = d.train.images
    assert x.shape[1:] == (3, 32, 32)
    assert torch.equal(x[:, 0], x[:, 1]) and torch.equal(x[:, 1], x[:, 2])  # grey replicated


def test_synthetic_is_deterministic_balanced_and_seeded():
    x1, y1 = make_synthetic(300, seed=3, split="train")
    x2, y2 = make_synthetic(300, seed=3, split="train")
    x3, _ = make_synthetic(300, seed=3, split="val")
    assert x1.dtype == np.uint8 and x1.shape == (300, 3, 32, 32)
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    assert not np.array_equal(x1, x3)  # splits come from different generators
    counts = np.bincount(y1, minlength=len(CLASSES))
    assert counts.min() > 300 / len(CLASSES) / 2  # every class present in similar numbers
    # Not a trivial set: the mean colour of an image says nothing about its class.
    means = x1.reshape(300, 3, -1).mean(-1)
    per_class = np.stack([means[y1 == k].mean(0) for k in range(len(CLASSES))])
    assert per_class.std(0).max() < 10


def test_synthetic_cache_is_reused_and_a_damaged_file_regenerated(tmp_path, monkeypatch):
    spec = DatasetSpec(name="synthetic", n_train=64, n_val=16, n_test=16, cache=str(tmp_path))
    first = load_dataset(spec)
    files = sorted(tmp_path.glob("synthetic-*.npz"))
    assert len(files) == 3
    import prunefx.data.synthetic as S

    monkeypatch.setattr(S, "make_synthetic", lambda **kw: pytest.fail("cache not used"))
    again = load_dataset(spec)
    assert torch.equal(first.train.images, again.train.images)
    monkeypatch.undo()
    files[0].write_bytes(b"not an npz")
    assert torch.equal(load_dataset(spec).test.labels, first.test.labels)


def test_unknown_dataset_and_keys_name_the_fix():
    with pytest.raises(DatasetError, match=r"unknown dataset 'digit'.*did you mean 'digits'"):
        DatasetSpec.from_dict({"name": "digit"})
    with pytest.raises(DatasetError, match=r"unknown key 'imag_size'.*did you mean 'image_size'"):
        DatasetSpec.from_dict({"name": "digits", "imag_size": 16})
    with pytest.raises(DatasetError, match="needs root"):
        DatasetSpec(name="cifar10").check()


def test_cifar_missing_on_disk_is_an_error_never_a_download(tmp_path, no_network):
    with pytest.raises(DatasetError, match=r"cifar-10-batches-py.*never downloads"):
        load_dataset(DatasetSpec(name="cifar10", root=str(tmp_path)))
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset(DatasetSpec(name="cifar100", root=str(tmp_path / "nope")))
    assert no_network == []


def test_imagefolder_reads_splits_and_checks_the_layout(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(3):
                Image.fromarray(rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(
                    tmp_path / split / cls / f"{i}.png"
                )
    spec = DatasetSpec(name="imagefolder", root=str(tmp_path), image_size=32)
    assert spec.num_classes() == 2
    d = load_dataset(spec)
    assert d.classes == ("cat", "dog") and len(d.train) == 6 and d.test is d.val
    x, y = d.train[4]
    assert x.shape == (3, 32, 32) and y == 1
    assert d.example(4).shape == (4, 3, 32, 32)
    (tmp_path / "val" / "dog").rename(tmp_path / "val" / "bird")
    with pytest.raises(DatasetError, match="same class folders"):
        load_dataset(spec)
    with pytest.raises(DatasetError, match=r"lacks train/ and val/"):
        load_dataset(DatasetSpec(name="imagefolder", root=str(tmp_path / "train")))


def test_split_indices_cover_everything_once():
    parts = C._split_indices(101, (0.2, 0.1), seed=5)
    assert [len(p) for p in parts] == [71, 20, 10] and sorted(np.concatenate(parts).tolist()) == list(range(101))
