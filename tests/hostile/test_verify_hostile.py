"""Forwards that return nothing to compare: a clear error at analysis (exit code 2 on the command line), never
"fully prunable" and never a check that compares nothing and passes."""

from __future__ import annotations

import pytest
import torch
from _hostile import Sandbox, assert_refused, assert_untouched, invoke
from torch import nn

import prunefx
from prunefx.errors import PrunefxError

SILENT_PY = '''
import torch
from torch import nn


class Silent(nn.Module):
    """Computes, then returns RETURNS: nothing keeps its last layer's width."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        self.conv(x)
        return RETURNS


def silent():
    return Silent()
'''


@pytest.mark.parametrize(("returns", "what"), [
    ("None", r"returns None"), ("x.shape[0]", r"returns no tensor prunefx can reach \(1\)"),
])
def test_a_forward_without_tensor_outputs_is_refused_at_analysis(sandbox: Sandbox, returns: str, what: str) -> None:
    module = f"silent_{len(returns)}"  # one name per case: an imported factory module stays in sys.modules
    (sandbox.root / f"{module}.py").write_text(SILENT_PY.replace("RETURNS", returns))
    before = sandbox.snapshot()
    line = assert_refused(invoke("analyze", f"{module}:silent", "--imgsz", "16"),
                          rf"Silent's forward {what}: .*return the model's output tensor\(s\) from forward \(")
    assert "prunable" not in line
    assert_untouched(sandbox, before)


@pytest.mark.parametrize("capture", ["fx", "export"])
def test_analyze_raises_a_prunefx_error_for_a_forward_returning_none(capture: str) -> None:
    class Silent(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 1)

        def forward(self, x):
            self.conv(x)

    with pytest.raises(PrunefxError, match=r"^Silent's forward returns None: [^\n]* registered pytree types\)$"):
        prunefx.analyze(Silent(), torch.randn(1, 3, 4, 4), capture=capture)
