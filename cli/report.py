"""``prunefx report RUN_DIR``: re-render a pruning run's report from its report.json."""

from pathlib import Path
from typing import Annotated

import typer

from prunefx.cli._console import new_console
from prunefx.errors import PrunefxError


def report(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="Directory of a pruning run (holds report.json).")],
    write: Annotated[
        bool, typer.Option("--write", help="Also rewrite report.json, report.md, report.html and the plots.")
    ] = False,
    html: Annotated[bool, typer.Option("--html", help="Also write report.html (the interactive page) only.")] = False,
    # Read by cli.main's error handler, which is the only code that needs it.
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="On error, also print the traceback.")] = False,
) -> None:
    """Print the results table of the run in RUN_DIR, validating its report.json."""
    from prunefx.pipeline.rundir import check_finished
    from prunefx.report import load_report, render_table, write_report, write_report_html

    if not run_dir.is_dir():
        what = "does not exist" if not run_dir.exists() else "is a file, not a directory"
        raise PrunefxError(f"{run_dir} {what}; give the directory of a pruning run (the one holding report.json, "
                           "e.g. runs/prune/yolo)")
    check_finished(run_dir)  # a run (it has a state.json) counts only once its last stage finished
    data = load_report(run_dir)
    console = new_console()
    console.print(render_table(data))
    if write:
        for path in write_report(run_dir, data):
            console.out(f"wrote {path}")
    elif html:
        console.out(f"wrote {write_report_html(run_dir, data)}")
