"""recover(): distillation brings a pruned model of any output kind back towards the original, on held-out batches."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch
from torch import nn

pytest.importorskip("accelerate")

import prunefx
from prunefx._config import ConfigError
from prunefx.train.recover import RecoverConfig, RecoverError, recover
from prunefx.train.user_code import UserCodeError

pytestmark = pytest.mark.filterwarnings("ignore::prunefx.errors.TiedScoresWarning")  # random-init weight norms


def _sines(n: int, seed: int) -> list[torch.Tensor]:
    """Batches of raw 1-D signals: sines of random frequency and phase plus noise (16 x 1 x 64 each)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(64) / 64
    out = []
    for _ in range(n):
        f, phase = torch.rand(16, 1, 1, generator=g) * 8 + 1, torch.rand(16, 1, 1, generator=g) * 6.3
        out.append(torch.sin(2 * math.pi * f * t + phase) + 0.1 * torch.randn(16, 1, 64, generator=g))
    return out


class Regressor(nn.Module):
    """Raw samples in, one number out (a frequency estimate)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(1, 16, 5, padding=2), nn.BatchNorm1d(16), nn.ReLU(),
                                  nn.Conv1d(16, 32, 5, stride=2, padding=2), nn.BatchNorm1d(32), nn.ReLU())
        self.fc = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x).mean(-1))


class Tagger(nn.Module):
    """Independent sigmoid scores (multi-label): 12 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 12))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TwoHeads(nn.Module):
    """A dict output: class logits and an embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(10, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU())
        self.embed, self.head = nn.Linear(48, 8), nn.Linear(48, 5)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.trunk(x)
        return {"logits": self.head(h), "embedding": self.embed(h)}


def _cut(model: nn.Module, x, **config):
    torch.manual_seed(0)
    teacher = model.eval()
    student = prunefx.prune(copy.deepcopy(teacher), x, {"ratio": 0.5, "scope": "local", **config},
                            criterion="l1").model
    return teacher, student


def _gaussian(n: int, shape: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for _ in range(n)]


def _quiet(_msg: str) -> None:
    pass


def test_a_1d_regression_model_is_brought_back_by_mse_distillation() -> None:
    torch.manual_seed(0)
    teacher, student = _cut(Regressor(), _sines(1, 0)[0][:1])
    held = _sines(4, 99)

    def error(model):  # relative output error on held-out signals
        with torch.no_grad():
            return float(sum((model(x) - teacher(x)).norm() / teacher(x).norm() for x in held) / len(held))

    before = error(student.eval())
    result = recover(student, teacher, _sines(16, 1), eval_data=held, metric=lambda m: -error(m),
                     config=RecoverConfig(steps=150, lr=3e-3, log_every=0), log=_quiet)
    assert result.losses == {"output": "mse"}
    assert result.evals[-1]["distill"] < 0.5 * result.evals[0]["distill"]  # held-out distillation loss falls
    assert error(student.eval()) < 0.5 * before
    assert result.evals[-1]["metric"] == pytest.approx(-error(student))  # the user's metric, on the recovered model
    assert not student.training


def test_independent_sigmoid_scores_recover_with_the_binary_kl() -> None:
    torch.manual_seed(0)
    teacher, student = _cut(Tagger(), torch.randn(1, 20))
    held = _gaussian(4, (32, 20), 99)

    def agreement(model):  # share of the 12 yes/no decisions that match the teacher's
        with torch.no_grad():
            return float(torch.cat([(model(x) > 0) == (teacher(x) > 0) for x in held]).float().mean())

    before = agreement(student.eval())
    result = recover(student, teacher, _gaussian(16, (32, 20), 1), eval_data=held,
                     config=RecoverConfig(steps=200, lr=3e-3, loss="bce", temperature=1.0, log_every=0), log=_quiet)
    assert result.losses == {"output": "bce"}
    assert result.evals[-1]["distill"] < 0.5 * result.evals[0]["distill"]
    assert agreement(student.eval()) > before + 0.05 and agreement(student) > 0.88


def test_a_dict_output_gets_a_loss_per_leaf_and_named_features_are_distilled() -> None:
    torch.manual_seed(0)
    teacher, student = _cut(TwoHeads(), torch.randn(1, 10))
    held = _gaussian(4, (32, 10), 99)

    def agreement(model):  # top-1 class agreement with the teacher
        with torch.no_grad():
            return float(torch.cat([model(x)["logits"].argmax(1) == teacher(x)["logits"].argmax(1)
                                    for x in held]).float().mean())

    before = agreement(student.eval())
    result = recover(student, teacher, _gaussian(16, (32, 10), 1), eval_data=held,
                     config=RecoverConfig(steps=150, lr=3e-3, features=("embed",), log_every=50), log=_quiet)
    assert result.losses == {"embedding": "mse", "logits": "kl"}  # by leaf name: logits get the KL
    assert result.evals[-1]["distill"] < 0.5 * result.evals[0]["distill"]
    assert [h["step"] for h in result.history] == [50, 100, 150]
    assert agreement(student.eval()) > before + 0.05


def test_feature_widths_the_plan_changed_are_refused_with_the_fix() -> None:
    torch.manual_seed(0)
    teacher, student = _cut(TwoHeads(), torch.randn(1, 10))
    with pytest.raises(RecoverError, match="distil features whose width the plan keeps"):
        recover(student, teacher, _gaussian(2, (8, 10), 1), config=RecoverConfig(steps=2, features=("trunk.0",)),
                log=_quiet)


def test_an_llm_recovers_its_next_token_agreement() -> None:
    transformers = pytest.importorskip("transformers")
    from prunefx.integrations import transformers as pfx_hf

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, max_position_embeddings=64)
    teacher = transformers.LlamaForCausalLM(cfg).eval()
    ids = _tokens(1, 1)[0][:1]
    student = pfx_hf.prune(copy.deepcopy(teacher), (ids,), prunefx.PlanConfig(ratio=0.5, scope="local")).model
    held = _tokens(4, 99)

    def agreement(model):
        with torch.no_grad():
            return float(torch.cat([model(x).logits.argmax(-1) == teacher(x).logits.argmax(-1)
                                    for x in held]).float().mean())

    before = agreement(student.eval())
    result = recover(student, teacher, [{"input_ids": x} for x in _tokens(16, 1)], eval_data=[
        {"input_ids": x} for x in held], config=RecoverConfig(steps=120, lr=2e-3, log_every=0), log=_quiet)
    assert result.losses == {"logits": "kl"}  # the cache object is not a tensor: nothing else is distilled
    assert result.evals[-1]["distill"] < 0.5 * result.evals[0]["distill"]
    assert agreement(student.eval()) > before + 0.1


def _tokens(n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 64, (8, 16), generator=g) for _ in range(n)]


class _Stop(Exception):
    pass


def test_a_run_interrupted_and_resumed_ends_with_the_weights_of_an_uninterrupted_one(tmp_path) -> None:
    torch.manual_seed(0)
    teacher, pruned = _cut(Tagger(), torch.randn(1, 20))
    data = _gaussian(6, (16, 20), 1)
    cfg = RecoverConfig(steps=20, lr=3e-3, warmup=3, checkpoint_every=5, log_every=4)  # lines across the cut
    straight = copy.deepcopy(pruned)
    uninterrupted = recover(straight, teacher, data, config=cfg, log=_quiet)

    calls = []

    def stop_at_the_13th_batch(batch):
        calls.append(1)
        if len(calls) == 1 + 13:  # the first is the loss-kind probe; then one per step
            raise _Stop
        return batch

    first = copy.deepcopy(pruned)
    with pytest.raises(_Stop):
        recover(first, teacher, data, config=cfg, inputs=stop_at_the_13th_batch, checkpoint_dir=tmp_path / "ck",
                log=_quiet)
    assert (tmp_path / "ck" / "recover.json").is_file() and (tmp_path / "ck" / "state-10").is_dir()
    assert not (tmp_path / "ck" / "state-5").exists()  # the older checkpoint is replaced, not kept
    resumed = copy.deepcopy(pruned)  # a fresh process would rebuild the pruned model: the state brings the weights
    result = recover(resumed, teacher, data, config=cfg, checkpoint_dir=tmp_path / "ck", resume=True, log=_quiet)
    assert result.resumed_from == 10 and result.steps == 20
    assert [h["step"] for h in result.history] == [4, 8, 12, 16, 20]  # the whole run's progress, before the cut too
    assert [h["loss"] for h in result.history] == pytest.approx([h["loss"] for h in uninterrupted.history], rel=1e-4)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
    # Resuming the finished run (a restarted pipeline) loads its weights and trains nothing.
    again = copy.deepcopy(pruned)
    result = recover(again, teacher, data, config=cfg, inputs=_never_called_after_the_probe(), checkpoint_dir=tmp_path
                     / "ck", resume=True, log=_quiet)
    assert result.resumed_from == 20 and [h["step"] for h in result.history] == [4, 8, 12, 16, 20]
    for (name, a), b in zip(straight.state_dict().items(), again.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)


def test_a_resumed_run_draws_the_random_numbers_the_uninterrupted_one_drew(tmp_path) -> None:
    # dropout in the student: the resume must restore every process's RNG state from the checkpoint (JSON), or its
    # masks and so its weights differ from the uninterrupted run's
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 12)).eval()
    student = nn.Sequential(nn.Linear(20, 24), nn.ReLU(), nn.Dropout(0.3), nn.Linear(24, 12))
    data, cfg = _gaussian(3, (8, 20), 1), RecoverConfig(steps=6, lr=3e-3, checkpoint_every=2, log_every=0)
    straight = copy.deepcopy(student)
    recover(straight, teacher, data, config=cfg, log=_quiet)
    calls = []

    def stop_at_the_5th_batch(batch):
        calls.append(1)
        if len(calls) == 1 + 5:
            raise _Stop
        return batch

    with pytest.raises(_Stop):
        recover(copy.deepcopy(student), teacher, data, config=cfg, inputs=stop_at_the_5th_batch,
                checkpoint_dir=tmp_path / "ck", log=_quiet)
    torch.manual_seed(123)  # another process state: the checkpoint's RNG states replace it
    resumed = copy.deepcopy(student)
    assert recover(resumed, teacher, data, config=cfg, checkpoint_dir=tmp_path / "ck", resume=True,
                   log=_quiet).resumed_from == 4
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)


def _never_called_after_the_probe():
    calls = []

    def inputs(batch):
        calls.append(1)
        assert len(calls) == 1, "a finished run trained again"
        return batch
    return inputs


def test_checkpoint_directories_are_never_overwritten(tmp_path) -> None:
    teacher, student = _cut(Tagger(), torch.randn(1, 20))
    data, cfg = _gaussian(2, (8, 20), 1), RecoverConfig(steps=2, log_every=0)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    with pytest.raises(RecoverError, match="exists and is not empty"):
        recover(copy.deepcopy(student), teacher, data, config=cfg, checkpoint_dir=mine, log=_quiet)
    assert (mine / "notes.txt").read_text() == "the user's"
    ck = tmp_path / "ck"
    recover(copy.deepcopy(student), teacher, data, config=cfg, checkpoint_dir=ck, log=_quiet)
    with pytest.raises(RecoverError, match="pass resume=True"):
        recover(copy.deepcopy(student), teacher, data, config=cfg, checkpoint_dir=ck, log=_quiet)
    with pytest.raises(RecoverError, match="past steps=1"):
        recover(copy.deepcopy(student), teacher, data, config=replace(cfg, steps=1), checkpoint_dir=ck, resume=True,
                log=_quiet)
    with pytest.raises(RecoverError, match=r"other settings \(lr\)"):
        recover(copy.deepcopy(student), teacher, data, config=RecoverConfig(steps=4, lr=1.0), checkpoint_dir=ck,
                resume=True, log=_quiet)
    with pytest.raises(RecoverError, match="holds no recovery checkpoint"):
        recover(copy.deepcopy(student), teacher, data, config=cfg, checkpoint_dir=tmp_path / "none", resume=True,
                log=_quiet)


def test_bad_losses_metrics_data_and_settings_are_one_clear_error() -> None:
    teacher, student = _cut(Tagger(), torch.randn(1, 20))
    data = _gaussian(2, (8, 20), 1)

    def run(**kwargs):
        config = kwargs.pop("config", RecoverConfig(steps=2, log_every=0))
        return recover(copy.deepcopy(student), teacher, kwargs.pop("data", data), config=config, log=_quiet,
                       **kwargs)

    with pytest.raises(RecoverError, match=r"task_loss returned \(8, 12\), not a scalar"):
        run(task_loss=lambda out, batch: out)
    with pytest.raises(RecoverError, match="the loss is nan at step 1; lower lr"):
        run(task_loss=lambda out, batch: out.sum() * float("nan"))
    with pytest.raises(RecoverError, match="metric returned 'good'"):
        run(metric=lambda m: "good")
    # the user's functions: any exception or exit is one error naming the function
    with pytest.raises(UserCodeError, match=r"^the metric test_recover:.*<lambda> raised ZeroDivisionError: division "
                                            r"by zero; fix the function$"):
        run(metric=lambda m: 1 / 0)
    with pytest.raises(UserCodeError, match=r"the task_loss .*exits called sys.exit\(0\) instead of returning"):
        run(task_loss=_exits)
    with pytest.raises(RecoverError, match="one-shot iterator"):
        run(data=iter(data))
    with pytest.raises(RecoverError, match="data yielded no batch"):
        run(data=[])
    with pytest.raises(RecoverError, match="its leaves are: output"):
        run(config=RecoverConfig(steps=2, loss={"logits": "kl"}))
    with pytest.raises(ConfigError, match="steps=0"):
        RecoverConfig(steps=0)
    with pytest.raises(ConfigError, match="loss 'hinge'"):
        RecoverConfig(loss="hinge")


def _exits(out, batch):
    raise SystemExit(0)


def test_a_student_that_cannot_learn_is_refused_before_any_work() -> None:
    teacher, student = _cut(Tagger(), torch.randn(1, 20))
    data = _gaussian(2, (8, 20), 1)
    with pytest.raises(RecoverError, match="the student is the teacher object"):  # was: an empty parameter list
        recover(teacher, teacher, data, config=RecoverConfig(steps=2), log=_quiet)
    assert all(p.requires_grad for p in teacher.parameters())
    with pytest.raises(RecoverError, match=r"no trainable parameter.*requires_grad_\(True\)"):
        recover(copy.deepcopy(student).requires_grad_(False), teacher, data, config=RecoverConfig(steps=2), log=_quiet)


_TWO_PROCESSES = """
import sys
sys.path.insert(0, sys.argv[2])
import torch, test_recover as t
from accelerate import Accelerator
from prunefx.train.recover import RecoverConfig, recover
acc = Accelerator(cpu=True)
torch.manual_seed(0)
teacher, student = t._cut(t.Tagger(), torch.randn(1, 20))
result = recover(student, teacher, t._gaussian(8, (8, 20), 1), config=t.TWO_PROCESS_CONFIG, accelerator=acc,
                 log=t._quiet)
if acc.is_main_process:
    torch.save({"state": student.state_dict(), "processes": result.processes}, sys.argv[1])
"""
TWO_PROCESS_CONFIG = RecoverConfig(steps=12, lr=3e-3, warmup=2, log_every=0)


@pytest.mark.slow
def test_two_processes_under_torchrun_match_one_process_on_the_same_batches(tmp_path) -> None:
    # Each of 2 ranks takes every other batch and DDP averages the gradients: one process fed each pair of batches
    # as one batch takes the same steps (the losses are means; the mse scale is the mean over both ranks).
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "two.py"
    script.write_text(_TWO_PROCESSES)
    out = tmp_path / "two.pt"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(port), str(script), str(out), str(Path(__file__).parent)], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    two = torch.load(out, weights_only=True)
    assert two["processes"] == 2
    torch.manual_seed(0)
    teacher, student = _cut(Tagger(), torch.randn(1, 20))
    data = _gaussian(8, (8, 20), 1)
    pairs = [torch.cat(data[i:i + 2]) for i in range(0, 8, 2)]
    one = recover(student, teacher, pairs, config=TWO_PROCESS_CONFIG, log=_quiet)
    assert one.processes == 1
    for name, value in student.state_dict().items():
        torch.testing.assert_close(two["state"][name], value, rtol=1e-4, atol=1e-5, msg=name)


def test_the_teacher_is_given_back_unchanged_in_its_mode() -> None:
    teacher, student = _cut(Tagger(), torch.randn(1, 20))
    teacher.train()
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    recover(student, teacher, _gaussian(4, (8, 20), 1), config=RecoverConfig(steps=8, lr=1e-2, log_every=0),
            log=_quiet)
    assert teacher.training and all(p.requires_grad for p in teacher.parameters())
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    assert not student.training and all(p.requires_grad for p in student.parameters())


def test_the_teacher_is_given_back_in_its_mode_when_recovery_fails() -> None:
    teacher, student = _cut(Tagger(), torch.randn(1, 20))
    teacher.train()

    def nan_loss(out, batch):
        return out.sum() * float("nan")

    with pytest.raises(RecoverError, match="the loss is nan"):
        recover(student, teacher, _gaussian(4, (8, 20), 1), task_loss=nan_loss,
                config=RecoverConfig(steps=4, lr=1e-2, log_every=0, task_weight=0.5), log=_quiet)
    assert teacher.training and all(p.requires_grad for p in teacher.parameters())


def test_keyword_batches_and_inputs_are_model_calls() -> None:
    teacher, student = _cut(Tagger(), torch.randn(1, 20))
    xs = _gaussian(4, (8, 20), 1)
    name = list(__import__("inspect").signature(Tagger.forward).parameters)[1]  # the forward's input, by name
    cfg = RecoverConfig(steps=6, lr=1e-2, log_every=0)
    runs = {}
    for how, data in (("positional", xs), ("mapping", [{name: x} for x in xs]),
                      ("inputs", [prunefx.Inputs(**{name: x}) for x in xs])):
        runs[how] = copy.deepcopy(student)
        recover(runs[how], teacher, data, config=cfg, log=_quiet)
    changed = any(not torch.equal(a, b) for a, b in zip(student.state_dict().values(),
                                                         runs["positional"].state_dict().values(), strict=True))
    assert changed  # the runs trained
    for how in ("mapping", "inputs"):  # the same calls, so the same weights
        for (k, a), b in zip(runs["positional"].state_dict().items(), runs[how].state_dict().values(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{how}: {k}")


def test_without_a_teacher_it_fine_tunes_on_the_task_loss_with_sgd_and_step_decay() -> None:
    torch.manual_seed(0)
    teacher, student = _cut(Regressor(), _sines(1, 0)[0][:1])
    freq = [_frequency(x) for x in _sines(8, 3)]  # (signal, frequency) pairs: the regressor's own task
    data = [(x, f) for x, f in zip(_sines(8, 3), freq, strict=True)]

    def task(out: torch.Tensor, batch) -> torch.Tensor:
        return (out.squeeze(1) - batch[1]).square().mean()

    cfg = RecoverConfig(steps=40, lr=0.02, optimizer="sgd", schedule="step", milestones=(0.5,), gamma=0.1,
                        log_every=10)
    before = sum(float(task(student(x), (x, f))) for x, f in data) / len(data)
    result = recover(student, None, data, config=cfg, inputs=lambda b: b[0], task_loss=task, log=_quiet)
    after = sum(float(task(student.eval()(x), (x, f))) for x, f in data) / len(data)
    assert result.losses == {} and after < 0.5 * before
    assert [h["lr"] for h in result.history] == pytest.approx([0.02, 0.002, 0.002, 0.002])  # after steps 10..40
    assert all(h["process_loss"] == [pytest.approx(h["loss"])] for h in result.history)  # one process
    with pytest.raises(RecoverError, match="no teacher and no task_loss"):
        recover(student, None, data, config=cfg, log=_quiet)
    with pytest.raises(ConfigError, match="optimizer='adam'"):
        RecoverConfig(optimizer="adam")


def _frequency(x: torch.Tensor) -> torch.Tensor:
    """The dominant frequency of each signal (its FFT peak), the regression target."""
    return torch.fft.rfft(x.squeeze(1)).abs()[:, 1:].argmax(1).float() + 1


class _Scores(nn.Module):
    """Ten class scores from a small MLP: logits, or their softmax (a probability head, as trained nets return)."""

    def __init__(self, probabilities: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10))
        self.probabilities = probabilities

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.net(x) * 4
        return z.softmax(-1) if self.probabilities else z


def _scores_pair(probabilities: bool) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    teacher = _Scores(probabilities)
    student = copy.deepcopy(teacher)
    with torch.no_grad():
        for p in student.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # a damaged copy: the same function to find again
    return student, teacher


def test_a_softmax_head_recovers_with_the_default_loss_as_its_logit_version_does() -> None:
    g = torch.Generator().manual_seed(0)
    train = [torch.randn(32, 20, generator=g) for _ in range(8)]
    held = [torch.randn(64, 20, generator=g) for _ in range(2)]
    config = RecoverConfig(steps=60, lr=3e-3, log_every=20)
    gains, lines = {}, []
    for probabilities in (False, True):
        student, teacher = _scores_pair(probabilities)

        def error(m: nn.Module, prob: bool = probabilities, t: nn.Module = teacher) -> float:
            with torch.no_grad():  # on probabilities for both versions
                as_p = (lambda y: y) if prob else (lambda y: y.softmax(-1))
                return sum(float((as_p(m(x)) - as_p(t(x))).abs().mean()) for x in held) / len(held)

        before = error(student)
        result = recover(student, teacher, train, config=config, log=lines.append)
        gains[probabilities] = before - error(student)
        assert result.history[-1]["loss"] < result.history[0]["loss"]
    assert result.outputs == {"output": "distribution"} and result.losses == {"output": "kl"}
    assert any("kl on log p (distribution: rows sum to 1)" in line for line in lines)
    assert gains[False] > 0
    # mse on the probabilities (the old default) got about a third of the logit version's gain here
    assert gains[True] >= 0.75 * gains[False]


def test_probabilities_declared_on_raw_outputs_are_one_clear_error() -> None:
    student, teacher = _scores_pair(False)
    with pytest.raises(RecoverError, match="outputs='probabilities' but .* outside \\[0, 1\\]"):
        recover(student, teacher, [torch.randn(8, 20)], config=RecoverConfig(steps=1, outputs="probabilities"),
                log=lambda _m: None)
    with pytest.raises(ConfigError, match="outputs='odds'"):
        RecoverConfig(outputs="odds")


def test_a_recovery_that_makes_the_model_worse_returns_the_best_state_and_says_so() -> None:
    g = torch.Generator().manual_seed(1)
    train = [torch.randn(32, 20, generator=g) for _ in range(4)]
    held = [torch.randn(64, 20, generator=g)]
    for keep_best in (True, False):
        _, teacher = _scores_pair(False)
        student = copy.deepcopy(teacher)
        with torch.no_grad():
            student.net[0].bias.add_(0.01)  # agrees on every held-out row, but has a gradient to follow
        start = copy.deepcopy(student.state_dict())

        def agreement(m: nn.Module, t: nn.Module = teacher) -> float:  # higher is better
            with torch.no_grad():
                return sum(float((m(x).argmax(-1) == t(x).argmax(-1)).float().mean()) for x in held) / len(held)

        first = agreement(student)
        lines: list[str] = []
        # an lr a thousand times too large wrecks the student within a few steps
        result = recover(student, teacher, train, config=RecoverConfig(steps=20, lr=5.0, schedule="constant",
                                                                       keep_best=keep_best, log_every=0),
                         metric=agreement, log=lines.append)
        assert result.evals[-1]["metric"] < result.evals[0]["metric"] == first
        assert result.worse_than_start and result.judged_by == "metric (higher is better)"
        assert result.best is not None and result.best["step"] == 0
        said = [line for line in lines if "worse than the start" in line]
        assert len(said) == 1
        same = all(torch.equal(v, start[k]) for k, v in student.state_dict().items())
        if keep_best:
            assert result.kept == "best" and same and agreement(student) == first
            assert "returned the best state, step 0" in said[0]
        else:
            assert result.kept == "end" and not same and agreement(student) < first
            assert "keep_best is off" in said[0]


def test_a_resumed_recovery_that_got_worse_returns_the_best_state_of_the_whole_run(tmp_path) -> None:
    # the best state is part of the checkpoint: a run stopped after its best evaluation and resumed returns it, as the
    # uninterrupted run does, and so does resuming the finished run
    g = torch.Generator().manual_seed(1)
    train, held = [torch.randn(32, 20, generator=g) for _ in range(4)], [torch.randn(64, 20, generator=g)]
    _, teacher = _scores_pair(False)
    start = copy.deepcopy(teacher)
    with torch.no_grad():
        start.net[0].bias.add_(0.01)

    def agreement(m: nn.Module) -> float:
        with torch.no_grad():
            return sum(float((m(x).argmax(-1) == teacher(x).argmax(-1)).float().mean()) for x in held) / len(held)

    cfg = RecoverConfig(steps=12, lr=5.0, schedule="constant", eval_every=4, checkpoint_every=4, log_every=0)
    calls = []

    def stop_at_the_7th_batch(batch):
        calls.append(1)
        if len(calls) == 1 + 7:  # the first is the loss-kind probe; then one per step
            raise _Stop
        return batch

    with pytest.raises(_Stop):
        recover(copy.deepcopy(start), teacher, train, config=cfg, inputs=stop_at_the_7th_batch, metric=agreement,
                checkpoint_dir=tmp_path / "ck", log=_quiet)
    assert (tmp_path / "ck" / "state-4" / "best.pt").is_file()
    for _ in range(2):  # the interrupted run resumed, then the finished run resumed
        resumed = copy.deepcopy(start)
        result = recover(resumed, teacher, train, config=cfg, metric=agreement, checkpoint_dir=tmp_path / "ck",
                         resume=True, log=_quiet)
        assert result.kept == "best" and result.best["step"] == 0 and result.worse_than_start
        assert all(torch.equal(v, start.state_dict()[k]) for k, v in resumed.state_dict().items())
