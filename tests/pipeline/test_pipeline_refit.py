"""prune.refit in a pipeline config: parsed, written back, refused beside bias compensation, run on the data."""

import json
from pathlib import Path

import pytest

from prunefx._config import ConfigError
from prunefx.pipeline import run_config
from prunefx.pipeline.job import CALIBRATION_BATCHES
from prunefx.pipeline.run_config import PruneSpec
from prunefx.report import load_report


def test_refit_key_parses_and_round_trips() -> None:
    spec = PruneSpec.parse({"refit": True, "target": {"flops": 0.5}}, train_keys=())
    assert spec.refit is True and PruneSpec.parse({}, train_keys=()).refit is False
    assert PruneSpec.parse(spec.to_dict(), train_keys=()) == spec


def test_refit_with_bias_compensation_is_refused() -> None:
    with pytest.raises(ConfigError, match="prune.refit replaces bias compensation"):
        PruneSpec.parse({"refit": True, "bias_compensation": True}, train_keys=())


def test_classification_pipeline_refits_on_training_batches(tmp_path) -> None:
    config = Path(__file__).resolve().parents[2] / "configs" / "digits_cnn.yaml"
    run = run_config(config, ["model=_classify_factories:tiny_bn_cnn", "dataset.image_size=8", "epochs=2",
                              "prune.sparsity.epochs=0", "prune.finetune.epochs=0", "prune.latency=false",
                              "threads=1", "prune.criterion=l1", "prune.refit=true", f"project={tmp_path}",
                              "name=refit"], log=lambda _: None)
    refit = json.loads((run.root / "state.json").read_text())["stages"]["prune"]["refit"]
    assert refit["batches"] == CALIBRATION_BATCHES and "training images" in refit["calibration"]
    assert refit["layers"] and refit["after"] < refit["before"]
    assert load_report(run.root)["settings"]["refit"] == refit  # report.json carries what the stage recorded
