"""Deployment above the verified model: post-training int8 with ONNX Runtime, checked against the float model.

``quantize.py`` drives ONNX Runtime's quantizer (calibration choice, per-layer cost, mixed precision);
``check.py`` compares the int8 and float ONNX files and shares no code with it; ``calibration.py`` turns the
user's batches into feeds.
"""

from prunefx.deploy.calibration import QuantizeError
from prunefx.deploy.check import OutputError
from prunefx.deploy.quantize import LayerError, Quantized, quantize

__all__ = ["LayerError", "OutputError", "QuantizeError", "Quantized", "quantize"]
