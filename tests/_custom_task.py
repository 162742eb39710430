"""Broken callables for the custom pipeline's bad-input tests (model / data / metric / task_loss SPECs)."""

import torch


def data_raises():
    raise RuntimeError("the dataset server is down")


def data_not_a_dict():
    return [torch.zeros(4, 1, 256)]


def data_wrong_inputs():
    batch = (torch.zeros(4, 3, 8, 8), torch.zeros(4, 1))  # images, for a model of 1-D signals
    return {"train": [batch], "val": [batch]}


def metric_text(model, batches):
    return "good"


def loss_not_scalar(out, batch):
    return (out - batch[1]).square()


class _ByName(torch.nn.Module):
    """A regressor whose forward takes its input by name (batches are dicts of keyword inputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                        torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def forward(self, signal=None, scale=None):
        out = self.body(signal)
        return out if scale is None else out * scale


def keyword_model():
    torch.manual_seed(0)
    return _ByName().eval()


def keyword_data():
    g = torch.Generator().manual_seed(0)

    def batch():
        x = torch.randn(8, 16, generator=g)
        return {"signal": x}, x.sum(1, keepdim=True)

    return {"train": [batch() for _ in range(4)], "val": [batch() for _ in range(2)]}


def keyword_metric(model, batches):
    with torch.no_grad():
        return {"mse": float(sum(((model(**x) - y) ** 2).mean() for x, y in batches) / len(batches))}


class _Counted(torch.utils.data.Dataset):
    """The keyword task's samples, counting every read (``READS``): a split the pipeline must stream, not copy."""

    READS = {"train": 0, "val": 0}

    def __init__(self, split: str, n: int) -> None:
        self.split, self.n = split, n
        g = torch.Generator().manual_seed(1 if split == "train" else 2)
        self.x = torch.randn(n, 16, generator=g)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        _Counted.READS[self.split] += 1
        return {"signal": self.x[i]}, self.x[i].sum(0, keepdim=True)


def loader_data():
    _Counted.READS.update(train=0, val=0)
    return {split: torch.utils.data.DataLoader(_Counted(split, n), batch_size=8)
            for split, n in (("train", 32), ("val", 16))}


def generator_data():
    return {"train": (b for b in keyword_data()["train"]), "val": keyword_data()["val"]}


def metric_raises(model, batches):
    raise ValueError("the labels file is missing")


def metric_exits_after_the_cut(model, batches):
    """Fine for the model as given; ``sys.exit(0)`` for the pruned one: a run must not end 0 without its report."""
    import sys

    if model.body[0].out_features < 64:
        sys.exit(0)
    return keyword_metric(model, batches)


def loss_raises(out, batch):
    raise KeyError("target")


def data_exits():
    raise SystemExit(3)
