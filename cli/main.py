"""The ``prunefx`` command line: the commands (one module each) composed into one app, and its error policy."""

import traceback
import warnings
from typing import Any

import typer
from rich.text import Text
from typer.core import TyperCommand

from prunefx._io import storage_error
from prunefx.cli._console import new_console
from prunefx.errors import PrunefxError, TrustWarning
from prunefx.integrations.ultralytics.env import setup_offline

# Before any command imports ultralytics: it fixes its online flag and config dir at import time.
setup_offline()

from prunefx.cli.analyze import analyze
from prunefx.cli.data import shapes
from prunefx.cli.export import export
from prunefx.cli.flops import flops
from prunefx.cli.prune import prune
from prunefx.cli.quantize import quantize
from prunefx.cli.report import report


class _Command(TyperCommand):
    """A command whose bad input ends it with one red line on stderr and exit code 2.

    Bad input is a PrunefxError (the library's messages name the problem and the fix) or an OSError (a file
    that cannot be read or written). 2 is also what a usage error (unknown option, bad value) exits with:
    both mean "fix the input". With the command's ``--verbose`` the traceback is printed first. Other
    exceptions are bugs and keep typer's traceback.
    """

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            with warnings.catch_warnings():
                _show_trust_warnings()
                return super().invoke(ctx)
        except (PrunefxError, OSError) as exc:
            console = new_console(stderr=True)
            if ctx.params.get("verbose"):
                console.out("".join(traceback.format_exception(exc)), highlight=False, end="")
            # A full, read-only or forbidden disk: the path and the fix, not a bare "[Errno 28] ...".
            message = str(storage_error(exc) or exc)
            # soft_wrap: one line however narrow the terminal, so the error stays grep-able.
            console.print(Text(f"error: {_one_line(message)}", style="bold red"), soft_wrap=True)
            raise typer.Exit(2) from exc


def _show_trust_warnings() -> None:
    """Print every TrustWarning (a file loaded with full unpickling) as one yellow ``warning:`` line on stderr."""
    default = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, TrustWarning):
            new_console(stderr=True).print(Text(f"warning: {message}", style="yellow"), soft_wrap=True)
        else:
            default(message, category, *args, **kwargs)

    warnings.simplefilter("always", TrustWarning)  # every trusted file is named, not only the first
    warnings.showwarning = show  # restored by the enclosing catch_warnings


def _one_line(message: str) -> str:
    """A multi-line message (a list of problems, a trace location and fixes) joined into one line with '; '."""
    parts = [line.strip() for line in message.splitlines() if line.strip()]
    last = len(parts) - 1
    return " ".join(p if i == last or p.endswith((":", ";", ".")) else p + ";" for i, p in enumerate(parts))


app = typer.Typer(
    name="prunefx",
    help="Structured pruning for PyTorch: channel-dependency analysis, cost and reports.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals of a model forward are megabytes of tensors
)
for command in (analyze, flops, prune, export, quantize, report):
    app.command(cls=_Command)(command)
data_app = typer.Typer(help="Datasets prunefx generates (nothing is downloaded).", no_args_is_help=True)
data_app.command(cls=_Command)(shapes)
app.add_typer(data_app, name="data")


def main() -> None:
    """Entry point of the ``prunefx`` console script."""
    app(prog_name="prunefx")
