"""`prunefx prune configs/sine.yaml`: a custom task (a 1-D regressor, not an image classifier) pruned and recovered."""

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("accelerate")

import prunefx
from prunefx.cli.main import app
from prunefx.examples import sine
from prunefx.report import load_report

CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "sine.yaml")
# CI's xdist workers (--dist loadgroup): test_pipeline_llm.py and test_pipeline_custom.py run on one worker, whose
# base temp dir holds the example models they train once (the _cache fixture below)
pytestmark = pytest.mark.xdist_group("examples_cache")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    # one trained regressor for the module's runs (about 15 s), outside the repository
    monkeypatch.setenv("PRUNEFX_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _prune(*args: str):
    return CliRunner().invoke(app, ["prune", CONFIG, "trust_code=true", *args])


def test_the_sine_regressor_is_pruned_and_recovered_end_to_end(tmp_path: Path) -> None:
    result = _prune(f"project={tmp_path}", "name=s")
    assert result.exit_code == 0, result.output
    run = tmp_path / "s"
    state = json.loads((run / "state.json").read_text())
    assert state["status"] == "complete" and list(state["stages"]) == ["baseline", "prune", "finetune", "report"]
    r2 = {k: state["stages"][k]["metrics"]["r2"] for k in ("baseline", "prune", "finetune")}
    assert r2["baseline"] > 0.99  # trained here, near its plateau
    # the cut alone costs something (R^2 0.88 when measured), the default re-fit gives most of it back (0.998) ...
    cut = state["stages"]["prune"]["refit"]["metrics_before"]["r2"]
    assert cut < r2["baseline"] - 0.02 and r2["prune"] > cut + 0.5 * (r2["baseline"] - cut)
    assert r2["finetune"] > r2["baseline"] - 0.01  # ... and the recovery keeps it
    ft = state["stages"]["finetune"]
    assert ft["distill"]["teacher"] == "baseline" and ft["distill"]["losses"] == {"output": "mse"}
    assert ft["distill"]["steps"] == 4 * 16  # prune.finetune.epochs passes over the 16 training batches
    report = load_report(run)
    assert report["stages"]["finetuned"]["metrics"]["r2"] == pytest.approx(r2["finetune"])
    assert 0.45 < report["stages"]["finetuned"]["flops"] / report["stages"]["baseline"]["flops"] < 0.55
    # the saved recovered model is an ordinary prunefx checkpoint with the metric the report gives
    model = prunefx.load(run / "weights" / "finetuned.pt", sine.trained_regressor).eval()
    assert sine.metric(model, sine.make_data()["val"])["r2"] == pytest.approx(r2["finetune"], abs=1e-5)


def test_an_interrupted_recovery_resumes_without_redoing_the_cut(tmp_path: Path, monkeypatch) -> None:
    import prunefx.pipeline.backends.custom as custom

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(custom, "recover", stop)
    first = _prune(f"project={tmp_path}", "name=r")
    assert first.exit_code != 0
    state = json.loads((tmp_path / "r" / "state.json").read_text())
    assert state["status"] == "interrupted" and set(state["stages"]) == {"baseline", "prune"}
    pruned = (tmp_path / "r" / "weights" / "pruned.pt").stat().st_mtime_ns
    monkeypatch.undo()
    again = _prune(f"project={tmp_path}", "name=r", "resume=true")
    assert again.exit_code == 0, again.output
    assert "prune: done earlier, skipped" in again.output
    assert (tmp_path / "r" / "weights" / "pruned.pt").stat().st_mtime_ns == pruned
    assert json.loads((tmp_path / "r" / "state.json").read_text())["status"] == "complete"


def test_a_recovery_cut_mid_epoch_continues_from_its_last_epoch_to_the_uninterrupted_weights(tmp_path: Path,
                                                                                            monkeypatch) -> None:
    import prunefx.pipeline.backends.custom as custom

    assert _prune(f"project={tmp_path}", "name=straight").exit_code == 0
    real, calls = custom.recover, []

    def cut_in_the_third_epoch(*args, inputs, **kwargs):
        def counted(batch):
            calls.append(1)
            if len(calls) == 1 + 2 * 16 + 5:  # the loss-kind probe, two epochs of 16 batches, five more steps
                raise KeyboardInterrupt
            return inputs(batch)
        return real(*args, inputs=counted, **kwargs)

    monkeypatch.setattr(custom, "recover", cut_in_the_third_epoch)
    assert _prune(f"project={tmp_path}", "name=cut").exit_code != 0
    monkeypatch.undo()
    record = json.loads((tmp_path / "cut" / "weights" / "finetune_recover" / "recover.json").read_text())
    assert record["step"] == 2 * 16  # a checkpoint per epoch
    again = _prune(f"project={tmp_path}", "name=cut", "resume=true")
    assert again.exit_code == 0, again.output
    assert "steps from step 32 " in again.output  # continued, not restarted
    a = prunefx.load(tmp_path / "straight" / "weights" / "finetuned.pt", sine.trained_regressor)
    b = prunefx.load(tmp_path / "cut" / "weights" / "finetuned.pt", sine.trained_regressor)
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        # equal to round-off grown by Adam's 32 later steps (at most 2.3e-5 measured; not bitwise, unlike a
        # resumed prunefx.recover on its own): a wrong resume (fresh optimiser, schedule restarted) is far off
        torch.testing.assert_close(y, x, rtol=1e-3, atol=1e-4, msg=name)
    cut = json.loads((tmp_path / "cut" / "state.json").read_text())["stages"]["finetune"]["history"]
    whole = json.loads((tmp_path / "straight" / "state.json").read_text())["stages"]["finetune"]["history"]
    assert [h["loss"] for h in cut] == pytest.approx([h["loss"] for h in whole], rel=1e-3)  # lines across the cut


@pytest.mark.parametrize(("args", "message"), [
    (["trust_code=false"], "add trust_code: true"),
    (["data=_custom_task:data_raises"], "the data function _custom_task:data_raises raised RuntimeError: the dataset "
                                        "server is down; fix the function"),
    (["data=_custom_task:data_exits"], "the data function _custom_task:data_exits called sys.exit(3) instead of "
                                       "returning"),
    (["metric=_custom_task:metric_raises"], "the metric _custom_task:metric_raises raised ValueError: the labels file "
                                            "is missing; fix the function"),
    (["data=_custom_task:data_not_a_dict"], "return a dict with 'train' and 'val'"),
    (["data=_custom_task:generator_data"], "train split is a generator without a length or that passes only once"),
    (["data=_custom_task:data_wrong_inputs"], "cannot take _custom_task:data_wrong_inputs's training inputs"),
    (["metric=_custom_task:metric_text"], "metric returned 'good'; return a finite number"),
    (["data=_custom_task:nope"], "has no attribute 'nope'"),
    (["prune.sparsity.epochs=2"], "prune.sparsity trains from scratch"),
    (["prune.finetune.distill=false", "task_loss=null"], "nothing to recover with"),
    (["prune.finetune.schedule=linear"], "schedule='linear'"),
])
def test_bad_input_is_one_line_exit_2_and_no_run(tmp_path: Path, args: list[str], message: str) -> None:
    result = _prune(f"project={tmp_path}", "name=bad", *args)
    assert result.exit_code == 2 and message in result.output.replace("\n", ""), result.output
    assert not (tmp_path / "bad").exists()


def test_a_task_loss_that_is_not_a_scalar_fails_the_stage_with_the_fix(tmp_path: Path) -> None:
    result = _prune(f"project={tmp_path}", "name=loss", "task_loss=_custom_task:loss_not_scalar")
    assert result.exit_code == 2 and "not a scalar tensor; reduce it" in result.output.replace("\n", "")
    state = json.loads((tmp_path / "loss" / "state.json").read_text())
    assert state["status"] == "failed" and "finetune" not in state["stages"]  # never looks recovered
    assert not (tmp_path / "loss" / "weights" / "finetuned.pt").exists()


KEYWORD_TASK = ("model=_custom_task:keyword_model", "data=_custom_task:keyword_data",
                "metric=_custom_task:keyword_metric", "task_loss=null", "prune.criterion=l1", "prune.finetune.epochs=1")


@pytest.mark.parametrize(("args", "message"), [
    (["metric=_custom_task:metric_exits_after_the_cut"],
     "the metric _custom_task:metric_exits_after_the_cut called sys.exit(0) instead of returning"),
    (["task_loss=_custom_task:loss_raises"], "the task_loss _custom_task:loss_raises raised KeyError: 'target'; fix "
                                             "the function"),
])
def test_user_code_failing_mid_run_is_one_line_exit_2_and_no_report(tmp_path: Path, args: list[str],
                                                                    message: str) -> None:
    # a metric's sys.exit(0) after the cut ended prunefx with exit 0 and no report; a raising task_loss was a traceback
    result = _prune(f"project={tmp_path}", "name=u", *KEYWORD_TASK, *args)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], result.output
    state = json.loads((tmp_path / "u" / "state.json").read_text())
    assert state["status"] == "failed" and "report" not in state["stages"]
    assert not (tmp_path / "u" / "report.json").exists()


def test_the_example_task_is_deterministic_and_its_splits_are_disjoint() -> None:
    a, b = sine.make_data(), sine.make_data()
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(a["train"], b["train"], strict=True))
    train, val = torch.cat([x for x, _ in a["train"]]), torch.cat([x for x, _ in a["val"]])
    assert train.shape == (1024, 1, 256) and val.shape == (256, 1, 256)
    assert torch.cdist(val.flatten(1), train.flatten(1)).min() > 1.0  # no validation signal is a training one


@pytest.mark.slow
def test_a_byte_level_llama_is_cut_refitted_and_distilled(tmp_path: Path) -> None:
    # configs/stdlib_lm.yaml: heads and MLP units halved, the re-fit on training windows, KL on the logits mixed
    # with the next-byte loss; perplexity per byte on held-out standard-library bytes at each stage.
    pytest.importorskip("transformers")
    config = str(Path(__file__).resolve().parents[2] / "configs" / "stdlib_lm.yaml")
    result = CliRunner().invoke(app, ["prune", config, "trust_code=true", f"project={tmp_path}", "name=lm"])
    assert result.exit_code == 0, result.output
    state = json.loads((tmp_path / "lm" / "state.json").read_text())
    ppl = {k: state["stages"][k]["metrics"]["ppl"] for k in ("baseline", "prune", "finetune")}
    assert ppl["baseline"] < 10  # trained: far below the 256 of a uniform guess
    assert ppl["prune"] > ppl["baseline"] and ppl["finetune"] < ppl["prune"]
    refit = state["stages"]["prune"]["refit"]
    assert {x["name"].rsplit(".", 1)[-1] for x in refit["layers"]} == {"o_proj", "down_proj"}
    assert refit["after"] < refit["before"]
    assert state["stages"]["finetune"]["distill"]["losses"] == {"logits": "kl"}


def test_batches_of_keyword_inputs_are_pruned_and_recovered(tmp_path: Path) -> None:
    result = _prune(f"project={tmp_path}", "name=kw", "model=_custom_task:keyword_model",
                    "data=_custom_task:keyword_data", "metric=_custom_task:keyword_metric", "task_loss=null",
                    "prune.criterion=l1", "prune.finetune.epochs=1")
    assert result.exit_code == 0, result.output
    state = json.loads((tmp_path / "kw" / "state.json").read_text())
    assert state["status"] == "complete"
    report = load_report(tmp_path / "kw")
    assert report["stages"]["finetuned"]["flops"] < 0.6 * report["stages"]["baseline"]["flops"]


def test_dataloader_splits_are_streamed_not_copied(tmp_path: Path) -> None:
    # DataLoaders over Datasets: building the task reads one batch per split (and the metric its val passes); the
    # recovery passes over the training split epoch by epoch, so the training samples are read epochs x 32 times
    # (+ the first batch, + 8 per calibration batch), never all at once before training
    import _custom_task

    from prunefx.pipeline.backends.custom import CustomBackend, CustomJob

    args = {"task": "custom", "project": str(tmp_path), "name": "dl", "trust_code": True,
            "model": "_custom_task:keyword_model", "data": "_custom_task:loader_data",
            "metric": "_custom_task:keyword_metric", "task_loss": None}
    backend = CustomBackend(CustomJob.from_config(args), log=lambda s: None)
    assert _custom_task._Counted.READS["train"] == 8  # the first batch only
    assert len(backend.calibration(2)) == 2 and _custom_task._Counted.READS["train"] == 8 + 16
    result = _prune(f"project={tmp_path}", "name=dl", "model=_custom_task:keyword_model",
                    "data=_custom_task:loader_data", "metric=_custom_task:keyword_metric", "task_loss=null",
                    "prune.criterion=l1", "prune.finetune.epochs=2")
    assert result.exit_code == 0, result.output
    state = json.loads((tmp_path / "dl" / "state.json").read_text())
    assert state["status"] == "complete" and state["stages"]["finetune"]["distill"]["steps"] == 2 * 4
    assert _custom_task._Counted.READS["train"] >= 2 * 32  # every epoch read the split anew


@pytest.mark.slow
def test_a_depth_cut_before_the_width_cut_saves_both_plans_and_reloads(tmp_path: Path) -> None:
    # prune.depth on a custom task: one decoder layer removed (checked by the depth oracle), then the widths; the
    # saved model carries [DepthPlan, PruningPlan] and prunefx.load rebuilds it on a fresh model of the factory
    pytest.importorskip("transformers")
    from prunefx.examples import stdlib_lm as lm

    config = str(Path(__file__).resolve().parents[2] / "configs" / "stdlib_lm.yaml")
    result = CliRunner().invoke(app, ["prune", config, "trust_code=true", f"project={tmp_path}", "name=d",
                                      "prune.depth.remove=1", "prune.target.params=0.5", "prune.finetune.epochs=1"])
    assert result.exit_code == 0, result.output
    run = tmp_path / "d"
    state = json.loads((run / "state.json").read_text())
    assert len(state["stages"]["prune"]["depth"]["removed"]) == 1
    report = load_report(run)
    assert report["stages"]["pruned"]["params"] / report["stages"]["baseline"]["params"] == pytest.approx(0.5,
                                                                                                         rel=0.03)
    model = prunefx.load(run / "weights" / "finetuned.pt", lm.trained_lm).eval()
    assert len(model.model.layers) == 3 and model.config.num_hidden_layers == 3
    assert lm.metric(model, lm.make_data()["val"])["ppl"] == pytest.approx(
        state["stages"]["finetune"]["metrics"]["ppl"], rel=1e-4)


@pytest.mark.parametrize("keep_best", [False, True])
def test_a_fine_tune_that_hurts_leaves_the_cut_model_as_the_result_and_says_so(tmp_path: Path,
                                                                               keep_best: bool) -> None:
    # an lr a thousand times too large wrecks the recovery; the metric is an error ("mse": lower is better)
    result = _prune(f"project={tmp_path}", "name=h", *KEYWORD_TASK, "prune.finetune.lr=3.0",
                    "prune.finetune.schedule=constant", f"prune.finetune.keep_best={str(keep_best).lower()}")
    assert result.exit_code == 0, result.output
    run = tmp_path / "h"
    state = json.loads((run / "state.json").read_text())
    cut, ft = state["stages"]["prune"]["metrics"]["mse"], state["stages"]["finetune"]
    assert ft["distill"]["worse_than_start"] is True
    assert ft["metrics"]["mse"] == cut  # the final model is the cut, by either guard
    model = prunefx.load(run / "weights" / "finetuned.pt", _keyword_model).eval()
    assert _keyword_metric(model)["mse"] == pytest.approx(cut, rel=1e-6)
    report = load_report(run)
    assert report["stages"]["finetuned"]["metrics"]["mse"] == pytest.approx(cut)
    if keep_best:  # recover itself returned its best evaluation: the start, which is the cut
        assert ft["distill"]["kept"] == "best" and "kept" not in ft
    else:  # recover returned its end; the pipeline compared it with the cut and kept the cut, reporting both
        assert ft["distill"]["kept"] == "end" and ft["kept"] == "pruned" and ft["finetuned_metrics"]["mse"] > cut
        assert report["settings"]["finetune"]["metrics_finetuned"]["mse"] > cut
        assert "fine-tune made it worse: kept the cut model" in result.output
        assert "| finetuned (fine-tune made it worse: kept the cut model) |" in (run / "report.md").read_text()


def _keyword_model():
    import _custom_task

    return _custom_task.keyword_model()


def _keyword_metric(model):
    import _custom_task

    return _custom_task.keyword_metric(model, _custom_task.keyword_data()["val"])
