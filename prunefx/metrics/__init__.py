"""Cost of a model: MACs/FLOPs (FLOPs = 2 x MACs), parameters, serialized size and measured latency.

>>> from prunefx.metrics import measure, latency
>>> m = measure(model, torch.randn(1, 3, 224, 224)); m.macs, m.flops, m.params, m.size_bytes

ultralytics' own GFLOPs convention lives with the ultralytics integration (``prunefx.integrations.ultralytics.gflops``).
"""

from prunefx.metrics.backends import Deployment
from prunefx.metrics.common import MetricsError
from prunefx.metrics.flops import CONVENTIONS, Measurement, measure
from prunefx.metrics.latency import Latency, compare_latency, latency

__all__ = [
    "CONVENTIONS", "Deployment", "Latency", "Measurement", "MetricsError", "compare_latency", "latency", "measure",
]
