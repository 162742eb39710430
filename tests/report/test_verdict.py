"""No verdict when every compared model scores 0 or at chance: nothing was learned, so nothing can be ranked."""

from __future__ import annotations

import torch

from prunefx.metrics import measure
from prunefx.report import Stage, build_report, render_markdown, report_html
from prunefx.report.verdict import verdict

X = torch.zeros(1, 3, 16, 16)


def _report(pruned: float, narrow: float, scratch: float, chance: float | None = None) -> dict:
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 4, 3))
    small = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 3))
    big, few = measure(m, (X,)), measure(small, (X,))
    controls = {"metric": "top1", "total_epochs": 6, "finetune_epochs": 0, "runs": [
        ("narrow", "uniformly narrower", 6, Stage(few, None, {"top1": narrow})),
        ("scratch", "pruned architecture", 6, Stage(few, None, {"top1": scratch})),
    ]}
    if chance is not None:
        controls["chance"] = chance
    return build_report(model="m", baseline=Stage(big, None, {"top1": 0.0}), pruned=Stage(few, None, {"top1": pruned}),
                        controls=controls)


def _says_no_verdict(report: dict, why: str) -> None:
    lines = verdict(report)
    assert len(lines) == 1 and lines[0].startswith("No verdict:"), lines
    assert why in lines[0] and "train longer" in lines[0] and "check the data" in lines[0]
    assert "matches" not in lines[0] and "beats" not in lines[0]
    assert render_markdown(report).rstrip().endswith(lines[0])  # report.md ends with it
    page = report_html(report)
    assert '<p class="verdict">No verdict:' in page and "Pruned matches" not in page


def test_every_model_at_zero_gets_no_verdict() -> None:
    _says_no_verdict(_report(0.0, 0.0, 0.0), "every model scores 0 on top1")


def test_every_model_at_or_below_chance_gets_no_verdict() -> None:
    # 10 classes: a guess scores 0.1; one model below it, two at it
    report = _report(0.1, 0.1, 0.0917, chance=0.1)
    assert report["controls"]["chance"] == 0.1
    _says_no_verdict(report, "at or below chance level 0.1000")


def test_a_model_above_chance_still_gets_a_verdict() -> None:
    lines = verdict(_report(0.35, 0.1, 0.1, chance=0.1))
    assert not any(line.startswith("No verdict") for line in lines)
    assert any("Pruned beats the narrow model by 25.0 points" in line for line in lines)
    # without a chance level only zeros stop the verdict: low equal scores are still a tie
    tied = " ".join(verdict(_report(0.1, 0.1, 0.1)))
    assert "No verdict" not in tied and "Pruned matches the narrow model" in tied
