"""``prunefx flops SPEC``: MACs, FLOPs, parameters, size and, optionally, measured latency of one forward."""

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

# Only light modules at the top (help texts included): each command imports torch and the library when it runs.
from prunefx._defaults import FORMS, INPUT_HELP, SIZES, TRUST_HELP
from prunefx.cli._console import new_console

ULTRALYTICS_CONVENTION = (
    "2 x GMACs of one 1 x C x imgsz x imgsz image counted by ultralytics-thop on the unfused model, "
    "as ultralytics prints it (BatchNorm 4 MACs per element; activations, pooling, cat and add not counted)"
)


class Backend(str, Enum):
    """What runs the timed forwards."""

    torch = "torch"  # torch eager, eval BatchNorm folded
    onnxruntime = "onnxruntime"  # ONNX Runtime on an in-memory ONNX export


class By(str, Enum):
    """What the breakdown table ranks."""

    module = "module"  # leaf modules: the layers that do the arithmetic
    op = "op"  # aten operators


def flops(
    spec: Annotated[str, typer.Argument(metavar="SPEC", help=f"Model: {FORMS}.")],
    imgsz: Annotated[int | None, typer.Option(help=f"Input image size (default: {SIZES}).")] = None,
    inputs: Annotated[
        list[str] | None, typer.Option("--input", metavar="[NAME=]SHAPE[:DTYPE]|FILE|MOD:FN", help=INPUT_HELP)
    ] = None,
    batch: Annotated[int, typer.Option(min=1, help="Batch size of the measured forward.")] = 1,
    by: Annotated[By, typer.Option(help="Break MACs down by leaf module or by aten op.")] = By.module,
    top: Annotated[int, typer.Option(min=1, help="Rows in the breakdown table.")] = 10,
    json_path: Annotated[
        Path | None,
        typer.Option("--json", help="Also write every number as JSON to this file.", dir_okay=False),
    ] = None,
    latency: Annotated[bool, typer.Option(help="Also time real forwards (eval, no_grad).")] = False,
    threads: Annotated[
        int | None, typer.Option(min=1, help="torch threads while timing (default: torch's).")
    ] = None,
    backend: Annotated[Backend, typer.Option(help="What runs the timed forwards.")] = Backend.torch,
    device: Annotated[str, typer.Option(help="Where to time: cpu, cuda, cuda:N.")] = "cpu",
    trust_checkpoint: Annotated[bool, typer.Option("--trust-checkpoint", help=TRUST_HELP)] = False,
    # Read by cli.main's error handler, which is the only code that needs it.
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="On error, also print the traceback.")] = False,
) -> None:
    """Count the MACs and FLOPs (= 2 x MACs) of one forward of SPEC, its parameters and size, and optionally time it."""
    from prunefx._io import atomic_write
    from prunefx.errors import PrunefxError
    from prunefx.metrics import CONVENTIONS, measure
    from prunefx.metrics import latency as measure_latency
    from prunefx.metrics.backends import Deployment
    from prunefx.metrics.latency import CONVENTION as LATENCY_CONVENTION
    from prunefx.spec import load_spec

    for given, hint in ((threads is not None, "--threads"), (backend is not Backend.torch, "--backend"),
                        (device != "cpu", "--device")):
        if given and not latency:
            raise typer.BadParameter("only applies to the latency measurement; add --latency.", param_hint=hint)
    if latency:  # a missing GPU or onnxruntime fails now, before the model is built
        Deployment(backend=backend.value, device=device, threads=threads).resolve()
    loaded = load_spec(spec, imgsz=imgsz, trust_checkpoint=trust_checkpoint, inputs=inputs or ())
    if loaded.given:  # the inputs as given, batch included
        if batch != 1:
            raise PrunefxError("--batch repeats an image; with --input give the batch in its shape (e.g. 4x1x1024)")
        inputs = loaded.example_inputs
    else:
        image = loaded.example_inputs[0]
        inputs = (image.expand(batch, *image.shape[1:]).contiguous(),)
    cost = measure(loaded.model, inputs, by="leaf")
    # Per image (batch 1) whatever the batch, as ultralytics defines it; only its models have a count of their own.
    gflops = loaded.family.native_gflops(loaded.model, loaded.example_inputs)
    timing = (
        measure_latency(loaded.model, inputs, threads=threads, backend=backend.value, device=device)
        if latency
        else None
    )

    caption = "FLOPs = 2 x MACs; M = 1e6, G = 1e9, MB = 1e6 bytes of the saved state_dict"
    if gflops is not None:
        caption += "; ultralytics GFLOPs follow ultralytics' own rules (BatchNorm counted 4x)"
    shapes = ", ".join(" x ".join(map(str, x.shape)) if hasattr(x, "shape") else type(x).__name__ for x in inputs)
    table = Table(title=f"{spec}: one forward of {shapes}", caption=caption)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_row("MACs", f"{cost.macs:,} ({cost.macs / 1e9:.3f} G)")
    table.add_row("FLOPs", f"{cost.flops:,} ({cost.flops / 1e9:.3f} G)")
    table.add_row("params", f"{cost.params:,} ({cost.params / 1e6:.3f} M)")
    table.add_row("size", "-" if cost.size_bytes is None else f"{cost.size_bytes / 1e6:.2f} MB")
    if gflops is not None:
        table.add_row("GFLOPs, ultralytics style (batch 1)", f"{gflops:.3f}")
    if timing is not None:
        table.add_row(
            "latency, median [p10, p90]",
            f"{timing.median_ms:.2f} ms [{timing.p10_ms:.2f}, {timing.p90_ms:.2f}], batch {timing.batch_size}, "
            f"{timing.threads} threads, {timing.device}, {timing.backend}: {timing.deployed}"
            + (f"; {timing.noise}" if timing.noise else ""),
        )
    console = new_console()
    console.print(table)
    console.print(_breakdown(cost.per_module if by is By.module else cost.per_op, cost.macs, by, top))
    if cost.uncounted:
        console.out(f"not counted (no formula): {', '.join(cost.uncounted)}")

    if json_path is not None:
        data: dict[str, Any] = {
            "spec": spec,
            "kind": loaded.kind,
            "batch": batch,
            **cost.to_dict(),
            "ultralytics_gflops": gflops,
            "latency": timing.to_dict() if timing else None,
            "conventions": {**CONVENTIONS, "latency": LATENCY_CONVENTION, "ultralytics_gflops": ULTRALYTICS_CONVENTION},
        }
        json_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(json_path, (json.dumps(data, indent=2) + "\n").encode())
        console.out(f"wrote {json_path}")


def _breakdown(macs: dict[str, int], total: int, by: By, top: int) -> Table:
    """The ``top`` largest entries of a MACs breakdown with their share of the total."""
    label = "leaf module" if by is By.module else "aten op"
    table = Table(title=f"top {min(top, len(macs))} of {len(macs)} by MACs ({label})")
    table.add_column(label, overflow="fold")
    table.add_column("MACs", justify="right")
    table.add_column("share", justify="right")
    for name, value in sorted(macs.items(), key=lambda kv: -kv[1])[:top]:
        table.add_row(name, f"{value:,}", f"{value / total:.1%}" if total else "-")
    return table
