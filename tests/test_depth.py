"""Depth pruning: residual blocks found from the graph, scored, removed; the result equals the original with the
removed blocks' residual branches zeroed (checked here independently of the oracle, by zeroing the weights of each
removed block's last layers in a copy)."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import prunefx
from prunefx.analysis import analyze
from prunefx.analysis.blocks import residual_blocks
from prunefx.depth import score_blocks
from prunefx.errors import PrunefxError, VerificationError
from prunefx.transform.depth import Bypass, block_calls

torchvision = pytest.importorskip("torchvision")


class PreNorm(nn.Module):
    """A pre-norm transformer block: h = x + attn(ln(x)); h + mlp(ln(h))."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Tiny(nn.Module):
    def __init__(self, depth: int = 5, d: int = 16) -> None:
        super().__init__()
        self.embed = nn.Linear(4, d)
        self.blocks = nn.Sequential(*[PreNorm(d) for _ in range(depth)])
        self.head = nn.Linear(d, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x)))


def _tiny(seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    return Tiny().eval()


def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy of the tiny model's 3 classes."""
    return F.cross_entropy(out.reshape(-1, 3), target.reshape(-1))


def _zero_branches(model: nn.Module, removed: list[str]) -> nn.Module:
    """A copy whose removed pre-norm blocks add zeros: their two output layers' weights and biases zeroed."""
    ref = copy.deepcopy(model)
    for path in removed:
        block = ref.get_submodule(path)
        for layer in (block.proj, block.fc2):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)
    return ref


def test_blocks_of_a_pre_norm_stack_are_its_layers_with_their_two_branches():
    m = _tiny()
    search = residual_blocks(m, analyze(m, torch.randn(2, 6, 4)).gm)
    assert [b.path for b in search.blocks] == [f"blocks.{i}" for i in range(5)]
    assert all(len(b.branches) == 2 and b.identity for b in search.blocks)
    assert search.blocks[0].params == sum(p.numel() for p in m.blocks[0].parameters())


def test_removed_blocks_equal_the_original_with_their_branches_zeroed():
    m = _tiny()
    x = torch.randn(2, 6, 4)
    original = copy.deepcopy(m)
    result = prunefx.prune_depth(m, x, remove=2, calibration=[torch.randn(4, 6, 4)])
    assert result.verified.ok and len(result.plan.remove) == 2
    assert sum(isinstance(b, Bypass) for b in m.blocks) == 2
    ref = _zero_branches(original, list(result.plan.remove))
    x2 = torch.randn(3, 7, 4)  # another input than the example: the equality is structural
    torch.testing.assert_close(m(x2), ref(x2), rtol=1e-5, atol=1e-6)
    assert sum(p.numel() for p in m.parameters()) == result.plan.params_after


def test_influence_is_one_minus_the_tokens_cosine():
    m = _tiny()
    x = torch.randn(2, 6, 4)
    dg = analyze(m, x)
    blocks = residual_blocks(m, dg.gm).blocks
    scores = score_blocks(m, blocks, block_calls(m, dg.gm, blocks, (x,))[0], [((x,), None)])
    h = m.embed(x)
    for i, block in enumerate(m.blocks):
        y = block(h)
        want = (1 - F.cosine_similarity(h.double(), y.double(), dim=-1)).mean().item()
        assert scores[f"blocks.{i}"] == pytest.approx(want, rel=1e-6, abs=1e-9)
        h = y


def test_output_criterion_with_a_loss_measures_each_block_removed_alone():
    m = _tiny()
    x, t = torch.randn(4, 6, 4), torch.randint(0, 3, (4, 6))
    result = prunefx.prune_depth(copy.deepcopy(m), x, remove=1, criterion="output", calibration=[(x, t)],
                                 loss_fn=loss)
    base = loss(m(x), t).item()
    for path, got in result.plan.scores:
        alone = _zero_branches(m, [path])
        assert got == pytest.approx(loss(alone(x), t).item() - base, rel=1e-4, abs=1e-6)
    assert result.plan.remove == (min(result.plan.scores, key=lambda s: s[1])[0],)


def test_resnet_keeps_blocks_that_change_shape_and_bypasses_keep_the_relu_after_the_add():
    m = torchvision.models.resnet18().eval()
    x = torch.randn(2, 3, 64, 64)
    search = residual_blocks(m, analyze(m, x).gm)
    assert [b.path for b in search.blocks] == ["layer1.0", "layer1.1", "layer2.1", "layer3.1", "layer4.1"]
    refused = dict(search.refused)
    assert "shortcut" in refused["layer2.0"]
    result = prunefx.prune_depth(m, x, params=0.7)
    assert result.verified.ok
    total = result.plan.params_before
    assert result.plan.params_after <= 0.7 * total
    own = dict((b.path, b.params) for b in search.blocks)
    # the fewest blocks: putting back the smallest removed one would break the target
    assert result.plan.params_after + min(own[p] for p in result.plan.remove) > 0.7 * total
    bypass = next(b for b in m.modules() if isinstance(b, Bypass))
    z = torch.randn(1, 8, 4, 4)
    torch.testing.assert_close(bypass(z), torch.relu(z))


def test_a_wrong_rewrite_fails_the_check_and_gives_the_blocks_back(monkeypatch):
    m = _tiny()
    x = torch.randn(2, 6, 4)
    before = m(x)
    monkeypatch.setattr(Bypass, "forward", lambda self, x: 2 * x)
    with pytest.raises(VerificationError, match="blocks are back"):
        prunefx.prune_depth(m, x, remove=1)
    assert not any(isinstance(b, Bypass) for b in m.modules())
    torch.testing.assert_close(m(x), before)


@pytest.mark.parametrize("kwargs,match", [
    (dict(remove=9), "has 5 removable blocks"),
    (dict(params=0.005), "cannot be met by removing blocks"),
    (dict(remove=1, params=0.5), "give one depth target"),
    (dict(remove=1, criterion="magic"), "unknown depth criterion"),
    (dict(remove=1, blocks=["embed"]), "embed cannot be removed"),
])
def test_bad_depth_targets_are_one_clear_error_and_leave_the_model(kwargs, match):
    m = _tiny()
    state = copy.deepcopy(m.state_dict())
    with pytest.raises(PrunefxError, match=match):
        prunefx.prune_depth(m, torch.randn(2, 6, 4), **kwargs)
    assert not any(isinstance(b, Bypass) for b in m.modules())
    assert all(torch.equal(state[k], v) for k, v in m.state_dict().items())


def test_one_block_of_each_kind_stays_and_the_only_one_is_never_a_candidate(monkeypatch):
    """``keep_one``: blocks of a kind the model needs (a hybrid model's attention layers): the only one of its kind is
    refused, too many removed is refused before any block is scored, and the plan never takes the last of a kind."""
    x = torch.randn(2, 6, 4)
    kinds = {"'a' block": ("blocks.0", "blocks.1", "blocks.2"), "'b' block": ("blocks.3",)}
    m = _tiny()
    with pytest.raises(PrunefxError, match=r"^blocks\.3 cannot be removed: it is the only 'b' block, which the model "
                                           r"needs$"):
        prunefx.prune_depth(m, x, remove=1, blocks=["blocks.3"], keep_one=kinds)

    def unscored(*args, **kwargs):
        raise AssertionError("blocks were scored before the refusal")

    monkeypatch.setattr(prunefx.depth, "score_blocks", unscored)
    with pytest.raises(PrunefxError, match=r"^remove=4, but the model has 3 removable blocks \(one of each kind "
                                           r"stays: 'a' block\): give 0 to 3$"):
        prunefx.prune_depth(m, x, remove=4, keep_one=kinds)  # blocks.4 (no kind), two of the three 'a' blocks
    monkeypatch.undo()
    for iterative in (False, True):  # the lowest-scored first, but never the last 'a' block nor the only 'b' one
        m = _tiny()
        result = prunefx.prune_depth(m, x, remove=3, keep_one=kinds, iterative=iterative)
        gone = set(result.plan.remove)
        assert "blocks.3" not in gone and "blocks.4" in gone and len(gone & set(kinds["'a' block"])) == 2
        assert result.verified.ok
        assert ("blocks.3", "the only 'b' block, which the model needs") in result.search.refused


def test_a_pruned_model_that_fails_the_after_check_gets_its_blocks_back():
    """``after``: an integration's check of the model the user gets (its default call), run after the oracle."""
    x = torch.randn(2, 6, 4)
    m = _tiny()
    before = m(x)
    seen = []

    def after(model):
        seen.append(sum(isinstance(b, Bypass) for b in model.modules()))
        return "the pruned model fails its default call (forced)"

    with pytest.raises(VerificationError, match=r"blocks are back: the pruned model fails its default call \(forced\)"):
        prunefx.prune_depth(m, x, remove=2, after=after)
    assert seen == [2]  # it saw the pruned model
    assert not any(isinstance(b, Bypass) for b in m.modules())
    torch.testing.assert_close(m(x), before)


def test_a_model_without_residual_blocks_says_so():
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.raises(PrunefxError, match="no removable residual block"):
        prunefx.prune_depth(m, torch.randn(2, 4), remove=1)


@pytest.mark.filterwarnings("ignore::prunefx.errors.TiedScoresWarning")  # random-init weights: l1 norms tie
def test_depth_and_width_plans_save_and_load_in_order(tmp_path):
    x = torch.randn(2, 3, 64, 64)
    m = torchvision.models.resnet18().eval()
    depth = prunefx.prune_depth(m, x, remove=2)
    width = prunefx.prune(m, x, prunefx.PlanConfig(ratio=0.3), criterion="l1")
    assert width.verified.ok
    prunefx.save(m, [depth.plan, width.plan], tmp_path / "both.pt")
    again = prunefx.load(tmp_path / "both.pt", torchvision.models.resnet18).eval()
    x2 = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(again(x2), m(x2))
    assert [b.removed for b in again.modules() if isinstance(b, Bypass)] == list(depth.plan.remove)
    stale = replace(depth.plan, remove=("layer2.0",), calls=(("layer2.0", depth.plan.calls[0][1]),))
    prunefx.save(m, [stale, width.plan], tmp_path / "stale.pt")
    with pytest.raises(PrunefxError, match="layer2.0, which the fresh model does not have as a residual block"):
        prunefx.load(tmp_path / "stale.pt", torchvision.models.resnet18)


def test_a_depth_plan_alone_round_trips_as_plain_data(tmp_path):
    m = _tiny()
    x = torch.randn(2, 6, 4)
    result = prunefx.prune_depth(m, x, remove=3)
    assert type(result.plan).from_dict(result.plan.to_dict()) == result.plan
    prunefx.save(m, result.plan, tmp_path / "d.pt")
    again = prunefx.load(tmp_path / "d.pt", _tiny)
    torch.testing.assert_close(again(x), m(x))
    with pytest.raises(PrunefxError, match="takes the PruningPlan or DepthPlan"):
        prunefx.save(m, "plan", tmp_path / "bad.pt")


def test_iterative_scoring_chooses_each_block_on_the_model_without_the_earlier_ones():
    m = _tiny()
    x, t = torch.randn(4, 6, 4), torch.randint(0, 3, (4, 6))
    result = prunefx.prune_depth(copy.deepcopy(m), x, remove=2, criterion="output", calibration=[(x, t)],
                                 loss_fn=loss, iterative=True)
    paths = [f"blocks.{i}" for i in range(5)]
    solo = {p: loss(_zero_branches(m, [p])(x), t).item() for p in paths}
    chosen_first = min(solo, key=solo.get)
    pair = {p: loss(_zero_branches(m, [chosen_first, p])(x), t).item() for p in paths if p != chosen_first}
    assert set(result.plan.remove) == {chosen_first, min(pair, key=pair.get)}
    assert result.plan.criterion == "output, iterative" and result.verified.ok


@pytest.mark.slow
@pytest.mark.parametrize("name,kwargs,count", [
    ("mobilenet_v2", {}, 10), ("convnext_tiny", {}, 22), ("vit_b_16", {"image_size": 64}, 12), ("swin_t", {}, 16),
    ("efficientnet_b0", {}, 9), ("regnet_y_400mf", {}, 12),
])
def test_torchvision_blocks_are_found_and_removed_exactly(name, kwargs, count):
    torch.manual_seed(0)
    m = getattr(torchvision.models, name)(**kwargs).eval()
    x = torch.randn(1, 3, 64, 64)
    before = sum(p.numel() for p in m.parameters())
    result = prunefx.prune_depth(m, x, remove=2)
    assert len(result.search.blocks) == count and result.verified.ok
    assert sorted(b.removed for b in m.modules() if isinstance(b, Bypass)) == sorted(result.plan.remove)
    gone = sum(result.search.block(p).params for p in result.plan.remove)
    assert sum(p.numel() for p in m.parameters()) == before - gone == result.plan.params_after


class _Shared(nn.Module):
    """blocks.0 called twice (shared weights); blocks.1 once, taking its stream by keyword beside a None mask."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([PreNorm(), _Keyword()])
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(2):
            x = self.blocks[0](x)
        return self.head(self.blocks[1](mask=None, hidden=x))


class _Keyword(PreNorm):
    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(hidden)


def test_a_shared_block_is_refused_and_a_keyword_stream_is_bypassed():
    torch.manual_seed(0)
    m = _Shared().eval()
    x = torch.randn(2, 5, 16)
    result = prunefx.prune_depth(m, x, remove=1)
    assert "called 2 times" in dict(result.search.refused)["blocks.0"]
    assert result.plan.remove == ("blocks.1",) and result.verified.ok
    torch.manual_seed(0)  # the same initialisation as m, its removed block's branches zeroed
    ref = _zero_branches(_Shared().eval(), ["blocks.1"])
    torch.testing.assert_close(m(x), ref(x))


class _TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(PreNorm(), PreNorm(), PreNorm())

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return self.blocks(x + bias)


def test_two_example_inputs_are_one_batch_of_two_inputs_not_inputs_and_targets():
    torch.manual_seed(0)
    m = _TwoInputs().eval()
    x, bias = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    with torch.no_grad():  # read as (inputs, targets), the model would be called without bias and raise
        h = x + bias
        want = (1 - F.cosine_similarity(h.double(), m.blocks[0](h).double(), dim=-1)).mean().item()
    result = prunefx.prune_depth(m, (x, bias), remove=1)
    assert result.verified.ok
    assert dict(result.plan.scores)["blocks.0"] == pytest.approx(want, rel=1e-6)
