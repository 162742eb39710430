#!/usr/bin/env bash
# The release path: build the sdist and the wheel (the wheel from the sdist), install the wheel (not editable) in
# a fresh venv and run what a user runs first: analyze with --html, the classification pipeline (prune + report.html),
# prunefx report --html, and export of that run. Everything runs from a temporary directory outside the checkout,
# so the source tree cannot stand in for the installed package. Called by .ci/run after the tests; needs `build`
# (the test extra) in the calling environment's python.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export YOLO_CONFIG_DIR="$work/yolo"  # ultralytics' settings (prunefx imports it) stay in the temp dir
start=$SECONDS
step() { echo "wheel smoke: $1 ($((SECONDS - start)) s so far)"; }
# pip of the fresh venv; this machine's pip.conf names local indexes that lack most packages: one warning each
venv_pip() { "$work/venv/bin/pip" install -q "$@" 2>&1 | { grep -v "^WARNING: Location '" || true; }; }

python -m build --no-isolation --outdir "$work/dist" "$repo" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
wheel=("$work"/dist/prunefx-*.whl)
step "built $(cd "$work/dist" && echo *)"
python3 -m venv "$work/venv"
venv_pip "${wheel[0]}"
step "installed the wheel (the core library alone) in a fresh venv"

cd "$work"
PATH="$work/venv/bin:$PATH"
python - "$repo" <<'EOF'
import sys
from pathlib import Path

import prunefx.cli.main
import prunefx.report
import prunefx.view.page

for module in (prunefx, prunefx.report, prunefx.view.page, prunefx.cli.main):
    where = Path(module.__file__).resolve()
    assert "site-packages" in where.parts and not where.is_relative_to(sys.argv[1]), f"{module.__name__} from {where}"
EOF
# The core alone: a part whose extra is missing stops with one line naming the extra, exit status 2.
set +e; missing="$(prunefx analyze torchvision:resnet18 --imgsz 64 2>&1)"; status=$?; set -e
[ "$status" = 2 ] && [ "$(printf '%s\n' "$missing" | wc -l)" = 1 ] \
    && grep -q "pip install 'prunefx\[vision\]'" <<<"$missing" || { echo "core without torchvision: $missing"; exit 1; }
step "the core without torchvision: $missing"
venv_pip "${wheel[0]}[classify]"  # torchvision, scikit-learn (the digits set) and matplotlib (the plots)
step "installed the classify extra"
prunefx analyze torchvision:resnet18 --imgsz 64 --html groups.html >/dev/null
test -s groups.html
step "analyze --html"
# configs/digits_cnn.yaml with 4 epochs in all instead of 16: the pipeline's stages run, not its accuracy
prunefx prune "$repo/configs/digits_cnn.yaml" epochs=2 prune.sparsity.epochs=1 prune.finetune.epochs=1 \
    prune.latency=false project="$work/runs" name=digits >"$work/prune.log" 2>&1 \
    || { cat "$work/prune.log"; exit 1; }
run="$work/runs/digits"
for f in report.json report.md report.html graph.json plan.json weights/finetuned.pt; do test -s "$run/$f"; done
step "prune configs/digits_cnn.yaml"
rm "$run/report.html" && prunefx report "$run" --html >/dev/null && test -s "$run/report.html"
step "report --html"
venv_pip "${wheel[0]}[deploy]"  # onnx + onnxruntime: export is an extra
prunefx export "$run"
test -s "$run/model.onnx"
step "export: passed"
