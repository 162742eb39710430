"""The oracle is deterministic and robust: train-only randomness, functional BatchNorm, batch-1 train mode,
float32 round-off and discontinuous ops each get a hand-built pattern (issue 15, R2)."""

import copy
import dataclasses
import math
import re
from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F
from _nets import randomize_bn
from torch import nn

import prunefx
from prunefx.plan import CostModel, PlanConfig, make_plan
from prunefx.transform.rewrite import apply_plan
from prunefx.verify import verify


def _pruned(model, x, ratio=0.5, seed=0, capture="auto"):
    """(original copy, pruned model, plan) with random scores; nothing verified yet."""
    original = copy.deepcopy(model)
    dg = prunefx.analyze(model, x, capture=capture)
    g = torch.Generator().manual_seed(seed)
    scores = {gr.id: torch.rand(gr.channels, generator=g).numpy() for gr in dg.prunable}
    plan = make_plan(dg, scores, PlanConfig(ratio=ratio), cost=CostModel(model, dg, x))
    assert plan.pruned
    return original, apply_plan(model, dg, plan), plan


class DropPathBlock(nn.Module):
    """timm's drop_path, traced in training mode: x.new_empty(shape).bernoulli_(keep).div_(keep)."""

    def __init__(self, c=16, p=0.5):
        super().__init__()
        self.stem, self.conv, self.bn, self.head, self.p = nn.Conv2d(3, c, 1), nn.Conv2d(c, c, 3, padding=1), \
            nn.BatchNorm2d(c), nn.Conv2d(c, 4, 1), p

    def drop_path(self, x):
        if not self.training:
            return x
        keep = 1 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask.div_(keep)

    def hf_drop_path(self, x):  # transformers' flavour: keep + torch.rand(shape), floored
        keep = 1 - self.p
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        return x.div(keep) * (keep + torch.rand(shape, dtype=x.dtype, device=x.device)).floor_()

    def forward(self, x):
        x = self.stem(x)
        x = x + self.drop_path(torch.relu(self.bn(self.conv(x))))
        x = x + self.hf_drop_path(torch.relu(self.conv(x)))
        return self.head(x)


def test_drop_path_is_deterministic_and_prunes_the_residual_stream():
    model = randomize_bn(DropPathBlock()).eval()
    x = torch.randn(4, 3, 8, 8)
    dg = prunefx.analyze(model, x)
    stem = dg.group_of("stem")
    assert stem.prunable, stem.reasons  # new_empty no longer freezes the residual stream
    original, pruned, plan = _pruned(model, x)
    results = [verify(original, pruned, plan, x) for _ in range(3)]
    assert all(r.ok and r.max_rel_error < 1e-5 for r in results), results[0].message
    # and a real mismatch is still caught: one kept weight changed by 1%
    with torch.no_grad():
        pruned.head.weight[0, 0] *= 1.01
    assert not verify(original, pruned, plan, x).ok


class FunctionalBN(nn.Module):
    """timm BatchNormAct2d: F.batch_norm(..., self.training ...) and num_batches_tracked.add_(1) in forward,
    then global pooling and a second such BN at one value per channel (batch 1)."""

    def __init__(self, c=12):
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, c, 3), nn.BatchNorm2d(c), nn.Conv2d(c, 5, 1)
        self.bn2 = nn.BatchNorm2d(5)

    def _bn(self, bn, x):
        if self.training:
            bn.num_batches_tracked.add_(1)
        return F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, self.training, 0.1, bn.eps)

    def forward(self, x):
        x = torch.relu(self._bn(self.bn, self.conv(x)))
        return self._bn(self.bn2, self.fc(x.mean((2, 3), keepdim=True)))


def test_functional_batch_norm_at_batch_one_uses_running_stats_and_updates_nothing():
    model = randomize_bn(FunctionalBN()).eval()
    x = torch.randn(1, 3, 8, 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dg = prunefx.analyze(model, x)  # training=True is baked into the graph: used to raise at batch 1
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "analyze changed a buffer"
    assert dg.group_of("conv").prunable
    result = prunefx.prune(model, x, PlanConfig(ratio=0.5))
    assert result.verified.ok, result.verified.message
    assert "train mode not checked: the original does not run in it" in result.verified.message


def test_batch_norm_1d_head_at_batch_one_is_not_held_against_the_pruned_model():
    model = randomize_bn(nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))).eval()
    x = torch.randn(1, 6)
    original, pruned, plan = _pruned(model, x)
    result = verify(original, pruned, plan, x)
    assert result.ok and result.runs_train, result.message
    assert any("train mode not checked" in n for n in result.notes)
    broken = copy.deepcopy(pruned)
    broken[3] = nn.Linear(7, 3)  # a pruned model that no longer runs in eval mode is still refused
    assert not verify(original, broken, plan, x).ok


class TopK(nn.Module):
    """Query selection as in DETR-style decoders: scores -> top-k indices -> gather the selected features."""

    def __init__(self, c=16, k=4):
        super().__init__()
        self.enc, self.score, self.k = nn.Conv1d(3, c, 1), nn.Conv1d(c, 1, 1), k
        self.out = nn.Conv1d(c, 5, 1)

    def forward(self, x):
        f = torch.relu(self.enc(x))
        idx = self.score(f).squeeze(1).topk(self.k, dim=1).indices
        picked = torch.gather(f, 2, idx.unsqueeze(1).expand(-1, f.shape[1], -1))
        return self.out(picked)


def test_discontinuous_op_is_compared_at_its_input_and_replayed():
    torch.manual_seed(0)
    model = TopK().eval()
    x = torch.randn(1, 3, 64)
    with torch.no_grad():  # scores of ~1e-7 with near-ties: the replay must not depend on their scale
        model.score.weight.mul_(1e-7)
        model.score.bias.zero_()
    original, pruned, plan = _pruned(model, x)
    result = verify(original, pruned, plan, x)
    assert result.ok, result.message
    replayed = any("replayed" in n for n in result.notes)
    assert replayed or result.max_rel_error == 0.0
    with torch.no_grad():  # the ranking itself changed: the input of top-k differs, nothing is replayed
        pruned.score.weight.mul_(-1)
    assert not verify(original, pruned, plan, x).ok


class RoundsOff(nn.Module):
    """A prunable Linear group, then ``(y + shift) - shift``: the identity in exact arithmetic, and ``shift`` is 0 in
    the original. A pruned copy given ``shift = 2**16`` rounds its outputs to multiples of 2**-7 in float32 (IEEE
    addition, the same on every CPU and BLAS: a relative error of ~4e-3, far past rtol) and of 2**-36 in float64."""

    def __init__(self, c=64):
        super().__init__()
        self.a, self.b = nn.Linear(16, c), nn.Linear(c, 4)
        self.shift = 0.0

    def forward(self, x):
        return (self.b(torch.relu(self.a(x))) + self.shift) - self.shift


def _rounds_off(model, capture="auto"):
    """(original, pruned copy whose forward rounds at 2**16, plan); a plain-float attribute, so traces bake it in."""
    torch.manual_seed(0)
    x = torch.randn(8, 16)
    original, pruned, plan = _pruned(model.eval(), x, capture=capture)
    pruned.shift = 2.0 ** 16
    return original, pruned, plan, x


def _float32_error(result):
    """The float32 error the float64 recheck note reports (the recheck ran when there is one)."""
    note = next(n for n in result.notes if "recomputed in float64" in n)
    return float(note.split("float32 max relative error ")[1].split(";")[0])


def _scaled(pruned, factor=1.001):
    """``pruned`` with ``b``'s outputs scaled by ``factor``: a real relative difference, which float64 keeps."""
    with torch.no_grad():
        pruned.b.weight.mul_(factor)
        pruned.b.bias.mul_(factor)


def test_float32_round_off_is_rechecked_in_float64():
    original, pruned, plan, x = _rounds_off(RoundsOff())
    result = verify(original, pruned, plan, x)
    assert result.ok, result.message
    assert _float32_error(result) > 1e-3  # the float64 path ran because float32 alone exceeds rtol
    assert result.max_rel_error < 1e-9  # 2**-36 rounding of ~1-sized outputs, plus float64's own round-off
    _scaled(pruned)  # a real 1e-3 difference survives float64
    result = verify(original, pruned, plan, x)
    assert not result.ok and result.max_rel_error > 5e-4, result.message


class MakesFloat32(RoundsOff):
    """Float32 made inside forward, as Qwen3's rotary positions and diffusers' timestep embeddings do: ``arange(...,
    dtype=torch.float32)``, ``torch.ones`` without a dtype, a constant tensor, ``.float()`` and ``.to(float32)``."""

    def forward(self, x):
        y = self.b(torch.relu(self.a(x)))
        n = y.shape[1]
        y = y @ torch.diag(torch.arange(1, n + 1, dtype=torch.float32)) @ torch.ones(n, n).triu()
        y = (y @ (torch.eye(4) * 0.5)).float().to(torch.float32)
        return (y + self.shift) - self.shift


@pytest.mark.parametrize("capture", ["fx", "export"])
def test_float64_recheck_runs_what_forward_makes_in_float32_in_float64(capture):
    original, pruned, plan, x = _rounds_off(MakesFloat32(), capture)
    before = torch.get_default_dtype()
    result = verify(original, pruned, plan, x, capture=capture)
    assert torch.get_default_dtype() is before
    assert result.ok, result.message
    assert _float32_error(result) > 1e-3 and result.max_rel_error < 1e-9, result.message
    _scaled(pruned)
    result = verify(original, pruned, plan, x, capture=capture)
    assert not result.ok and result.max_rel_error > 5e-4, result.message


def float32_kernel(x):
    """A custom kernel that takes float32 only (a fused op, a C++ extension); the graph calls it as one function."""
    if x.dtype != torch.float32:
        raise TypeError(f"float32 only, got {x.dtype}")
    return x


torch.fx.wrap("float32_kernel")


class RecheckFails(RoundsOff):
    def forward(self, x):
        return float32_kernel(super().forward(x))


class RecheckInHalf(RoundsOff):
    def forward(self, x):
        return super().forward(x).half()


@pytest.mark.parametrize(("model", "why"), [(RecheckFails, r"failed \(TypeError: float32 only"),
                                            (RecheckInHalf, r"did not run in float64 \(out came out in torch.float16")])
def test_a_float64_recheck_that_fails_is_a_failure_that_says_so(model, why):
    original, pruned, plan, x = _rounds_off(model())
    result = verify(original, pruned, plan, x)
    assert not result.ok
    assert re.match(r"not verified: float32 max relative error \S+ exceeds rtol 0.0001 and the float64 recheck "
                    r"that tells round-off from a real difference " + why, result.message), result.message
    assert not any("float64" in n for n in result.notes), result.notes  # in the verdict, not only in a note


@pytest.mark.parametrize("fn", ["dropout", "alpha_dropout"])
def test_train_only_functions_are_the_identity(fn):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 2, 1)

        def forward(self, x):
            return self.b(getattr(F, fn)(self.a(x), 0.5, True))

    model = M().eval()
    x = torch.randn(2, 3, 4, 4)
    original, pruned, plan = _pruned(model, x)
    assert verify(original, pruned, plan, x).ok


# ---- output structures: every leaf compared, by path; nothing compared is no pass --------------------------------


@dataclasses.dataclass
class Pair:
    main: object
    aux: object


class Aux(NamedTuple):
    feats: torch.Tensor
    scale: float


def _model_output(m):
    from transformers.modeling_outputs import BaseModelOutput  # a registered pytree node, and a dataclass

    return BaseModelOutput(last_hidden_state=m)


STRUCTURES = {  # how the model returns (main, aux), and the path of aux in it
    "dataclass": (lambda m, a: Pair(m, a), "out.aux"),
    "dict of dataclass": (lambda m, a: {"main": m, "extra": Pair(m * 2, [a])}, "out['extra'].aux[0]"),
    "dataclass of ModelOutput and namedtuple": (
        lambda m, a: Pair(_model_output(m), Aux(a, 0.5)), "out.aux.feats"),
}


class Heads(nn.Module):
    """A prunable stem feeding two heads, whose outputs ``form`` returns in some structure."""

    def __init__(self, form):
        super().__init__()
        self.stem, self.main, self.aux, self.form = nn.Conv2d(3, 16, 1), nn.Conv2d(16, 4, 1), nn.Conv2d(16, 2, 1), form

    def forward(self, x):
        h = torch.relu(self.stem(x))
        return self.form(self.main(h), self.aux(h))


@pytest.mark.parametrize("case", STRUCTURES)
def test_every_output_leaf_is_compared_by_its_path(case):
    if "ModelOutput" in case:
        pytest.importorskip("transformers")
    form, aux = STRUCTURES[case]
    x = torch.randn(2, 3, 6, 6)
    original, pruned, plan = _pruned(Heads(form).eval(), x)
    same = verify(original, pruned, plan, x)
    assert same.ok, same.message
    with torch.no_grad():  # only the output inside the dataclass changes: it must be seen
        pruned.aux.weight.mul_(1.01)
    result = verify(original, pruned, plan, x)
    assert not result.ok and f"at {aux} " in result.message, result.message
    assert aux in same.outputs and len(same.outputs) >= 2, same.outputs


class Returns(nn.Module):
    """A prunable stem and head; what else forward returns is up to ``extra`` (a plain attribute, so traces keep
    the value it had when traced)."""

    def __init__(self, extra):
        super().__init__()
        self.stem, self.head, self.extra = nn.Conv2d(3, 16, 1), nn.Conv2d(16, 4, 1), extra

    def forward(self, x):
        y = self.head(torch.relu(self.stem(x)))
        if self.extra == "debug":
            return {"y": y, "debug": y * 2}
        return {"y": y, "mode": self.extra}


def test_outputs_that_cannot_be_compared_are_named_and_fail():
    x = torch.randn(2, 3, 6, 6)
    original, pruned, plan = _pruned(Returns("a").eval(), x)
    assert verify(original, pruned, plan, x).ok
    pruned.extra = "debug"  # a key the original does not return, and one it does missing
    result = verify(original, pruned, plan, x)
    assert not result.ok and "the pruned model's output has out['debug'], the original's has not" in result.message
    assert "the pruned model's output has no out['mode']" in result.message, result.message
    pruned.extra = "b"  # a non-tensor leaf that differs
    result = verify(original, pruned, plan, x)
    assert not result.ok and "out['mode'] differs and is no tensor to compare ('a' vs 'b')" in result.message


class Opaque:
    """An output type neither pytree nor dataclasses know: prunefx cannot look inside."""

    def __init__(self, main, aux):
        self.main, self.aux = main, aux


class OpaqueRoot(nn.Module):
    """The root forward branches on tensor data (neither fx nor torch.export captures it): analysed part by part,
    checked end to end through its own forward, which returns ``wrap(main, aux)``."""

    def __init__(self, wrap):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 1), nn.ReLU(), nn.Conv2d(16, 4, 1))
        self.aux, self.wrap = nn.Conv2d(3, 2, 1), wrap

    def forward(self, x):
        y = self.body(x)
        if y.max() > -1e9:
            y = y * 1.0
        return self.wrap(y, self.aux(x))


def test_the_whole_model_check_of_a_partial_capture_compares_every_leaf():
    x = torch.randn(2, 3, 6, 6)
    original, pruned, plan = _pruned(OpaqueRoot(Pair).eval(), x)
    same = verify(original, pruned, plan, x)
    assert same.ok and any("partial capture" in n for n in same.notes), same.message
    with torch.no_grad():
        pruned.aux.weight.mul_(1.01)
    result = verify(original, pruned, plan, x)
    assert not result.ok and "at out.aux " in result.message, result.message
    assert same.outputs == ("out.main", "out.aux")


def test_nothing_compared_is_a_failure_not_a_pass():
    x = torch.randn(2, 3, 6, 6)
    original, pruned, plan = _pruned(OpaqueRoot(Opaque).eval(), x)
    result = verify(original, pruned, plan, x)
    assert not result.ok and math.isnan(result.max_rel_error), result.message
    assert result.message.startswith("not verified: ") and "nothing to compare: the original's output <" in \
        result.message, result.message


# ---- NaN / inf: named, not "not deterministic" -------------------------------------------------------------------


@pytest.mark.parametrize(("where", "named"), [
    ("original parameter", "parameter 'a.weight' of the original holds NaN (1 of 1024 values)"),
    ("pruned parameter", "parameter 'b.weight' of the pruned model holds NaN (1 of "),
    ("original buffer", "buffer 'bn.running_var' of the original holds NaN (1 of 64 values)"),
])
def test_non_finite_weights_are_named(where, named):
    model = nn.Sequential()
    model.a, model.bn, model.relu, model.b = nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 4)
    x = torch.randn(8, 16)
    original, pruned, plan = _pruned(randomize_bn(model).eval(), x)
    dg = prunefx.analyze(original, x)  # as prune's trials pass it: the analysis of the finite model
    with torch.no_grad():
        {"original parameter": original.a.weight, "pruned parameter": pruned.b.weight,
         "original buffer": original.bn.running_var}[where][0, ...].view(-1)[0] = float("nan")
    result = verify(original, pruned, plan, x, dg=dg)
    assert not result.ok and result.message.startswith(f"not verified: {named}"), result.message
    assert "load finite weights" in result.message


def test_non_finite_outputs_are_named():
    class Log(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(16, 64), nn.Linear(64, 4)

        def forward(self, x):
            return {"logp": torch.log(self.b(torch.relu(self.a(x))))}  # log of negative values: NaN

    x = torch.randn(8, 16)
    original, pruned, plan = _pruned(Log().eval(), x)
    result = verify(original, pruned, plan, x)
    assert not result.ok
    assert "out['logp'] of the original's (pruned channels zeroed) output holds NaN/inf" in result.message, \
        result.message


def test_infs_both_models_return_at_the_same_places_are_no_error():
    class Masked(nn.Module):
        """Logits with -inf where the input says so (padding), as attention masks and samplers return them."""

        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(16, 64), nn.Linear(64, 4)

        def forward(self, x):
            return self.b(torch.relu(self.a(x))).masked_fill(x[:, :4] > 0.5, float("-inf"))

    x = torch.randn(8, 16)
    original, pruned, plan = _pruned(Masked().eval(), x)
    result = verify(original, pruned, plan, x)
    assert result.ok, result.message  # -inf == -inf: no inf - inf = NaN
    with torch.no_grad():
        pruned.b.bias[0] += 1.0
    assert not verify(original, pruned, plan, x).ok  # and the finite values are still compared


class Normed(nn.Module):
    """fc1 -> LayerNorm -> fc2: fc1's channels pass through the LayerNorm's statistics (inexact by design)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.ln, self.fc2 = nn.Linear(8, 32), nn.LayerNorm(32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(self.ln(self.fc1(x)))


def test_proven_inexact_and_failed_are_distinct_states_and_only_proven_is_ok():
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    proven = verify(*_pruned(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval(), x), x)
    inexact = verify(*_pruned(Normed().eval(), x), x)
    original, broken, plan = _pruned(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval(), x)
    with torch.no_grad():
        broken[2].weight.mul_(2.0)  # a kept weight changed: the oracle must see it
    failed = verify(original, broken, plan, x)
    assert [r.state for r in (proven, inexact, failed)] == ["proven", "inexact", "failed"]
    assert [r.ok for r in (proven, inexact, failed)] == [True, False, False]  # ok: proven equal, nothing less
    assert [r.accepted for r in (proven, inexact, failed)] == [True, True, False]
    assert "not exactly verifiable" in inexact.message and inexact.inexact_groups
    assert inexact.headline().startswith("inexact by design") and failed.headline().startswith("FAILED")
    assert proven.headline() == proven.message
    with pytest.raises(ValueError, match="ok is True exactly when"):
        dataclasses.replace(inexact, ok=True)  # never ok beside a contradicting state


def test_prune_returns_an_inexact_cut_labelled_not_as_proven():
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    result = prunefx.prune(Normed().eval(), x, PlanConfig(ratio=0.5), criterion="l2")
    assert result.verified.state == "inexact" and not result.verified.ok and result.verified.accepted
    assert "check: inexact by design, not proven equal: not exactly verifiable" in result.summary()
