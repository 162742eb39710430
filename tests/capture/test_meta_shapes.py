"""The shape pass's fast meta results equal torch's meta kernels, raise where they raise, step aside otherwise."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from prunefx.capture.meta_shapes import fast_function, fast_method, fast_module


def _m(*shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device="meta")


FUNCTION_CALLS = [
    (operator.add, (_m(2, 3, 4), _m(2, 3, 4)), {}),
    (operator.add, (_m(2, 3, 4), _m(3, 1)), {}),  # broadcast
    (operator.mul, (_m(1, 8, 5, 5), _m(1, 8, 1, 1)), {}),
    (operator.truediv, (_m(4, 6), 3), {}),  # int scalar keeps the float dtype
    (operator.sub, (2.5, _m(4, 6, dtype=torch.float16)), {}),
    (torch.add, (_m(4, 6), _m(6)), {"alpha": 2}),
    (torch.maximum, (_m(1, 5), _m(3, 1)), {}),
    (operator.mul, (_m(2, 3, dtype=torch.bfloat16), True), {}),
    (operator.add, (_m(), _m(7, 2)), {}),  # 0-dim with n-dim
    (F.relu, (_m(2, 9),), {}),
    (F.gelu, (_m(2, 9),), {"approximate": "tanh"}),
    (torch.sigmoid, (_m(3, 3, dtype=torch.float64),), {}),
    (operator.neg, (_m(5),), {}),
    (torch.cat, ([_m(1, 4, 7, 7), _m(1, 12, 7, 7)], 1), {}),
    (torch.cat, ([_m(2, 3), _m(5, 3)],), {}),
    (torch.cat, ([_m(2, 3), _m(2, 4)],), {"dim": -1}),
    (torch.concat, ((_m(2, 3, dtype=torch.float16), _m(2, 3, dtype=torch.float16)), 0), {}),
    (F.adaptive_avg_pool2d, (_m(2, 16, 9, 7), 1), {}),
    (F.adaptive_avg_pool2d, (_m(16, 9, 7), (3, None)), {}),
    (F.adaptive_avg_pool1d, (_m(2, 4, 10),), {"output_size": 5}),
    (F.adaptive_avg_pool3d, (_m(1, 2, 4, 6, 8), (2, 3, 4)), {}),
]


@pytest.mark.parametrize("fn,args,kwargs", FUNCTION_CALLS, ids=lambda v: getattr(v, "__name__", None))
def test_function_results_equal_torch_meta_kernels(fn, args, kwargs):
    fast = fast_function(fn, args, kwargs)
    assert fast is not None, "the fast path must cover this call"
    ref = fn(*args, **kwargs)
    assert (fast.shape, fast.dtype, fast.device.type) == (ref.shape, ref.dtype, "meta")


METHOD_CALLS = [
    ("add", (_m(2, 3), _m(3)), {}),
    ("mul", (_m(4, 1, 3), 0.5), {}),
    ("__rmul__", (_m(4, 3), 2), {}),
    ("sigmoid", (_m(4, 3),), {}),
    ("contiguous", (_m(4, 3).t(),), {}),
    ("float", (_m(4, 3),), {}),
]


@pytest.mark.parametrize("name,args,kwargs", METHOD_CALLS, ids=lambda v: v if isinstance(v, str) else None)
def test_method_results_equal_torch_meta_kernels(name, args, kwargs):
    fast = fast_method(name, args, kwargs)
    assert fast is not None
    ref = getattr(args[0], name)(*args[1:], **kwargs)
    assert (fast.shape, fast.dtype) == (ref.shape, ref.dtype)


@pytest.mark.parametrize("module,x", [(nn.AdaptiveAvgPool2d((1, 1)), _m(2, 8, 5, 5)),
                                      (nn.AdaptiveAvgPool2d((None, 3)), _m(8, 5, 6)),
                                      (nn.AdaptiveAvgPool1d(4), _m(3, 2, 9))])
def test_module_results_equal_torch_meta_kernels(module, x):
    fast = fast_module(module, (x,), {})
    ref = module(x)
    assert fast is not None and (fast.shape, fast.dtype) == (ref.shape, ref.dtype)


MISMATCHES = [
    (operator.add, (_m(2, 3), _m(4, 3)), {}),
    (torch.cat, ([_m(2, 3), _m(2, 4)], 0), {}),
    (torch.cat, ([_m(2, 3), _m(2, 3)], 2), {}),
]


@pytest.mark.parametrize("fn,args,kwargs", MISMATCHES)
def test_sizes_the_kernel_rejects_are_rejected(fn, args, kwargs):
    with pytest.raises((RuntimeError, IndexError)):
        fn(*args, **kwargs)
    with pytest.raises((RuntimeError, IndexError)):
        fast_function(fn, args, kwargs)


STEP_ASIDE = [
    (operator.add, (_m(2, 3), _m(2, 3, dtype=torch.float16)), {}),  # promotion between tensors
    (operator.add, (_m(2, 3, dtype=torch.int64), 1), {}),  # integer tensors
    (operator.add, (torch.zeros(2, 3), torch.zeros(2, 3)), {}),  # not on meta: a real run
    (operator.add, (_m(2, 3), 1j), {}),  # a complex scalar changes the dtype
    (operator.add, ((1, 2), (3,)), {}),  # tuples: no tensor
    (F.relu, (_m(2, 3),), {"inplace": True}),
    (torch.div, (_m(2, 3), _m(2, 3)), {"rounding_mode": "floor"}),
    (torch.cat, ([_m(0), _m(2, 3)], 0), {}),  # the legacy empty 1-d tensor cat skips
    (F.leaky_relu, (_m(2, 3), 0.2), {}),
    (F.adaptive_avg_pool1d, (_m(2, 4, 10), None), {}),  # None keeps a dim in 2-d and 3-d pooling only
    (torch.matmul, (_m(2, 3), _m(3, 4)), {}),
]


@pytest.mark.parametrize("fn,args,kwargs", STEP_ASIDE)
def test_every_other_call_is_left_to_the_kernel(fn, args, kwargs):
    assert fast_function(fn, args, kwargs) is None


def test_the_shape_pass_records_the_same_values_with_and_without_the_fast_paths(monkeypatch):
    from prunefx.capture import values
    from prunefx.capture.trace import trace

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3)
            self.pool = nn.AdaptiveAvgPool2d(1)

        def forward(self, x):
            y = self.conv(x)
            s = torch.sigmoid(self.pool(y))
            z = torch.cat([y * s, F.relu(y) + 1.0], dim=1)
            return z.mean((2, 3)).add(0.5) / 2

    x = (torch.randn(2, 3, 12, 12),)

    def recorded():
        gm = trace(Net().eval(), x)
        values.propagate(gm, x)
        return [(n.name, tuple(v.shape), v.dtype) for n in gm.graph.nodes
                if isinstance(v := n.meta.get(values.VALUE_KEY), torch.Tensor)]

    fast = recorded()
    monkeypatch.setattr(values, "fast_function", lambda *a: None)
    monkeypatch.setattr(values, "fast_method", lambda *a: None)
    monkeypatch.setattr(values, "fast_module", lambda *a: None)
    assert recorded() == fast and len(fast) >= 9
