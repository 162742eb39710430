"""Cost of a model: MACs/FLOPs (FLOPs = 2 x MACs), parameters, serialized size and measured latency.

>>> from prunefx.metrics import measure, latency, ultralytics_gflops
>>> m = measure(model, torch.randn(1, 3, 224, 224)); m.macs, m.flops, m.params, m.size_bytes
"""

from .common import MetricsError
from .flops import CONVENTIONS, Measurement, measure
from .latency import Latency, latency
from .ultralytics import ultralytics_gflops

__all__ = ["CONVENTIONS", "Latency", "Measurement", "MetricsError", "latency", "measure", "ultralytics_gflops"]
