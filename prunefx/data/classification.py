"""Image-classification datasets that need no download: digits, prunefx's synthetic set, ImageFolder, CIFAR on disk.

>>> data = load_dataset(DatasetSpec(name="digits", image_size=32, seed=0))
>>> data.train[0][0].shape, data.num_classes        # (torch.Size([1, 32, 32]), 10)

Every split yields ``(image, label)`` with the image a normalised float tensor of ``channels x image_size x
image_size``; augmentation is the training loop's job (on whole batches). ``digits`` and ``synthetic`` live in
memory as :class:`TensorSplit` (the loop indexes whole batches at once); ImageFolder and CIFAR read from disk.
prunefx never downloads: a missing ``root`` is an error that says where the files must be.
"""

from __future__ import annotations

import difflib
import hashlib
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from prunefx._extras import require
from prunefx._io import atomic_write
from prunefx.errors import PrunefxError

NAMES = ("digits", "synthetic", "imagefolder", "cifar10", "cifar100")
# Channel statistics for data read from disk (ImageNet's for ImageFolder; CIFAR's own training-set values).
_STATS = {"imagefolder": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
          "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
          "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))}


class DatasetError(PrunefxError):
    """A dataset cannot be loaded as configured; the message says what is missing and how to fix it."""


@dataclass(frozen=True)
class DatasetSpec:
    """What to load. ``root`` for imagefolder/cifar; ``n_*``/``overlap`` for synthetic; fractions for digits/cifar."""

    name: str = "digits"
    root: str | None = None
    image_size: int | None = None  # default: 32 (digits, synthetic, cifar), 224 (imagefolder)
    channels: int | None = None  # default: the data's own (1 for digits, else 3); 1 <-> 3 converts
    seed: int = 0  # which images go to train/val/test (digits, cifar val) and the synthetic draw
    val_fraction: float = 0.15
    test_fraction: float = 0.15  # digits only: the other sets have their own test split
    n_train: int = 6000  # synthetic
    n_val: int = 1000
    n_test: int = 2000
    overlap: float = 22.0  # synthetic: stripe-orientation jitter in degrees (irreducible class overlap)
    cache: str | None = ".cache/datasets"  # synthetic: where generated arrays are kept (null: memory only)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DatasetSpec:
        known = sorted(f.name for f in fields(cls))
        for k in d:
            if k not in known:
                close = difflib.get_close_matches(str(k), known, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise DatasetError(f"unknown key {k!r} in dataset{hint}; known keys: {', '.join(known)}")
        spec = cls(**dict(d))
        spec.check()
        return spec

    def check(self) -> None:
        if self.name not in NAMES:
            close = difflib.get_close_matches(str(self.name), NAMES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise DatasetError(f"unknown dataset {self.name!r}{hint}; use one of {', '.join(NAMES)}")
        if self.image_size is not None and not 8 <= self.image_size <= 1024:
            raise DatasetError(f"dataset.image_size must be in [8, 1024], got {self.image_size}")
        if self.channels not in (None, 1, 3):
            raise DatasetError(f"dataset.channels must be 1 or 3 (or null for the data's own), got {self.channels}")
        if not (
            0 < self.val_fraction < 1 and 0 <= self.test_fraction < 1 and self.val_fraction + self.test_fraction < 1
        ):
            raise DatasetError("dataset.val_fraction and test_fraction must be in [0, 1) and sum to less than 1")
        if min(self.n_train, self.n_val, self.n_test) < 1:
            raise DatasetError("dataset.n_train, n_val and n_test must be >= 1")
        if self.name in ("imagefolder", "cifar10", "cifar100"):
            if not self.root:
                raise DatasetError(
                    f"dataset {self.name} needs root: the directory that holds it on disk "
                    "(prunefx never downloads datasets)"
                )
            if not Path(self.root).is_dir():
                raise DatasetError(f"dataset root {self.root} does not exist; {_layout(self.name)}")

    @property
    def native_channels(self) -> int:
        return 1 if self.name == "digits" else 3

    def num_classes(self) -> int:
        """How many classes the dataset has, without loading it (ImageFolder: the class folders in train/)."""
        if self.name == "imagefolder":
            train = Path(self.root or "") / "train"
            classes = [p for p in train.iterdir() if p.is_dir()] if train.is_dir() else []
            if not classes:
                raise DatasetError(f"ImageFolder root {self.root} has no class folders in train/; {_layout(self.name)}")
            return len(classes)
        return 100 if self.name == "cifar100" else 10

    @property
    def size(self) -> int:
        return self.image_size or (224 if self.name == "imagefolder" else 32)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ClassificationData:
    """Train/val/test splits plus what a model needs to know about them."""

    train: Dataset
    val: Dataset
    test: Dataset
    num_classes: int
    channels: int
    image_size: int
    classes: tuple[str, ...]
    name: str
    mean: tuple[float, ...]  # the normalisation applied (per channel)
    std: tuple[float, ...]

    def example(self, n: int = 1) -> torch.Tensor:
        """The first ``n`` training images as one batch (for tracing, bias-compensation means, verification)."""
        return torch.stack([self.train[i][0] for i in range(min(n, len(self.train)))])

    def summary(self) -> str:
        return (
            f"{self.name}: {len(self.train)}/{len(self.val)}/{len(self.test)} train/val/test images, "
            f"{self.num_classes} classes, {self.channels}x{self.image_size}x{self.image_size}"
        )


class TensorSplit(Dataset):
    """An in-memory split: float images (N, C, H, W) and int64 labels; indexable by a whole batch of indices."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]


def load_dataset(spec: DatasetSpec) -> ClassificationData:
    """Build the splits ``spec`` names (see the module docstring); raises :class:`DatasetError` on bad input."""
    spec.check()
    if spec.name == "digits":
        return _digits(spec)
    if spec.name == "synthetic":
        return _synthetic(spec)
    return _from_disk(spec)


# ---- in memory ------------------------------------------------------------------------------------------------


def _split_indices(n: int, fractions: Sequence[float], seed: int) -> list[np.ndarray]:
    """A seeded permutation of range(n) cut into len(fractions) + 1 pieces (the first takes the remainder)."""
    perm = np.random.default_rng(seed).permutation(n)
    sizes = [int(round(f * n)) for f in fractions]
    first = n - sum(sizes)
    cuts = np.cumsum([first, *sizes])[:-1]
    return np.split(perm, cuts)


def _normalised(
    images: torch.Tensor,
    size: int,
    channels: int,
    train: torch.Tensor | None = None,
    stats: tuple[Sequence[float], Sequence[float]] | None = None,
) -> tuple[torch.Tensor, tuple, tuple]:
    """Resize (bilinear) to ``size``, convert channels, normalise with ``stats`` or the training set's own."""
    x = _channels(images.float(), channels)
    if x.shape[-1] != size:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=x.shape[-1] > size)
    if stats is None:
        ref = x if train is None else x[train]
        mean, std = ref.mean(dim=(0, 2, 3)), ref.std(dim=(0, 2, 3)).clamp_min(1e-6)
    else:
        mean, std = torch.tensor(stats[0]), torch.tensor(stats[1])
    x = (x - mean[None, :, None, None]) / std[None, :, None, None]
    return x.contiguous(), tuple(mean.tolist()), tuple(std.tolist())


def _channels(x: torch.Tensor, channels: int) -> torch.Tensor:
    if x.shape[1] == channels:
        return x
    if channels == 3:
        return x.expand(-1, 3, -1, -1)
    return (x * torch.tensor([0.299, 0.587, 0.114])[None, :, None, None]).sum(1, keepdim=True)


def _digits(spec: DatasetSpec) -> ClassificationData:
    # shipped with scikit-learn: nothing is downloaded
    d = require("sklearn.datasets", "the digits dataset").load_digits()
    images = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(d.target, dtype=torch.int64)
    train, val, test = (
        torch.from_numpy(i) for i in _split_indices(len(labels), (spec.val_fraction, spec.test_fraction), spec.seed)
    )
    channels = spec.channels or spec.native_channels
    x, mean, std = _normalised(images, spec.size, channels, train)
    return ClassificationData(
        TensorSplit(x[train], labels[train]),
        TensorSplit(x[val], labels[val]),
        TensorSplit(x[test], labels[test]),
        10,
        channels,
        spec.size,
        tuple(str(i) for i in range(10)),
        "digits",
        mean,
        std,
    )


def _synthetic(spec: DatasetSpec) -> ClassificationData:
    from prunefx.data.synthetic import CLASSES

    arrays = {
        split: _synthetic_split(spec, split, n)
        for split, n in (("train", spec.n_train), ("val", spec.n_val), ("test", spec.n_test))
    }
    channels = spec.channels or 3
    images = torch.from_numpy(np.concatenate([a[0] for a in arrays.values()])).float() / 255.0
    n_train = spec.n_train
    x, mean, std = _normalised(images, spec.size, channels, torch.arange(n_train))
    splits, start = [], 0
    for _, (_, y) in arrays.items():
        splits.append(TensorSplit(x[start : start + len(y)], torch.from_numpy(y)))
        start += len(y)
    return ClassificationData(*splits, len(CLASSES), channels, spec.size, CLASSES, "synthetic", mean, std)


def _synthetic_split(spec: DatasetSpec, split: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Generate a split at its native 32 px, or reuse the cached copy (written atomically, keyed by its arguments)."""
    from prunefx.data.synthetic import GENERATOR_VERSION, make_synthetic

    args = {"n": n, "seed": spec.seed, "split": split, "overlap": spec.overlap, "size": 32}
    path = None
    if spec.cache:
        key = hashlib.sha256(json.dumps({**args, "version": GENERATOR_VERSION}, sort_keys=True).encode()).hexdigest()[
            :12
        ]
        path = Path(spec.cache) / f"synthetic-{split}-{key}.npz"
        if path.is_file():
            try:
                with np.load(path) as z:
                    return z["x"], z["y"]
            except (OSError, ValueError, KeyError):
                pass  # a damaged cache file is regenerated below
    x, y = make_synthetic(**args)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        np.savez(buf, x=x, y=y)
        atomic_write(path, buf.getvalue())  # ranks racing to write it write the same bytes; rename is atomic
    return x, y


# ---- on disk ----------------------------------------------------------------------------------------------------


def _layout(name: str) -> str:
    if name == "imagefolder":
        return (
            "an ImageFolder root holds train/<class>/*.jpg and val/<class>/*.jpg (and optionally test/); "
            "put the images there"
        )
    folder = "cifar-10-batches-py" if name == "cifar10" else "cifar-100-python"
    return (
        f"root must be the directory that contains {folder}/ (the python version of the dataset, extracted); "
        "prunefx never downloads it"
    )


def _from_disk(spec: DatasetSpec) -> ClassificationData:
    torchvision = require("torchvision", f"the {spec.name} dataset")
    from torchvision import transforms as T

    size, channels = spec.size, spec.channels or 3
    mean, std = _STATS[spec.name]
    if channels == 1:
        mean, std = (sum(mean) / 3,), (sum(std) / 3,)
    steps = (
        [T.Resize(size), T.CenterCrop(size)] if spec.name == "imagefolder" else ([T.Resize(size)] if size != 32 else [])
    )
    if channels == 1:
        steps.append(T.Grayscale(1))
    transform = T.Compose([*steps, T.ToTensor(), T.Normalize(mean, std)])
    root = Path(spec.root)
    try:
        if spec.name == "imagefolder":
            missing = [s for s in ("train", "val") if not (root / s).is_dir()]
            if missing:
                raise DatasetError(
                    f"ImageFolder root {root} lacks {' and '.join(m + '/' for m in missing)}; {_layout('imagefolder')}"
                )
            train = torchvision.datasets.ImageFolder(str(root / "train"), transform=transform)
            val = torchvision.datasets.ImageFolder(str(root / "val"), transform=transform)
            test = (
                torchvision.datasets.ImageFolder(str(root / "test"), transform=transform)
                if (root / "test").is_dir()
                else val
            )
            for name, split in (("val", val), ("test", test)):
                if split.classes != train.classes:
                    raise DatasetError(
                        f"ImageFolder {root}: {name}/ has classes {split.classes[:5]}... but train/ has "
                        f"{train.classes[:5]}...; every split needs the same class folders"
                    )
            classes = tuple(train.classes)
        else:
            cls = torchvision.datasets.CIFAR10 if spec.name == "cifar10" else torchvision.datasets.CIFAR100
            full = cls(str(root), train=True, transform=transform, download=False)
            test = cls(str(root), train=False, transform=transform, download=False)
            train_idx, val_idx = _split_indices(len(full), (spec.val_fraction,), spec.seed)
            train, val = (torch.utils.data.Subset(full, i.tolist()) for i in (train_idx, val_idx))
            classes = tuple(full.classes)
    except DatasetError:
        raise
    except (RuntimeError, FileNotFoundError, OSError) as exc:  # torchvision: "Dataset not found or corrupted"
        raise DatasetError(f"cannot read {spec.name} at {root} ({exc}); {_layout(spec.name)}") from exc
    return ClassificationData(
        train, val, test, len(classes), channels, size, classes, spec.name, tuple(mean), tuple(std)
    )


__all__ = ["NAMES", "ClassificationData", "DatasetError", "DatasetSpec", "TensorSplit", "load_dataset"]
