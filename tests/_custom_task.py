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
