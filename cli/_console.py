"""The rich Console every command prints through: the terminal's width on a terminal, no width limit otherwise."""

from typing import Any

from rich.console import Console
from rich.table import Table

# A file or pipe has no width: rich would wrap at $COLUMNS or 80 and split a table row (a long member name) over
# lines. Tables measure their content and nothing is padded to the console's width, so a width this large only
# means "never wrap".
UNBOUNDED = 1_000_000


class _UnboundedConsole(Console):
    """A Console that never wraps: no width limit, and every table at least as wide as its title and caption."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(*(self._fit_annotations(o) if isinstance(o, Table) else o for o in objects), **kwargs)

    def _fit_annotations(self, table: Table) -> Table:
        # rich wraps a title or caption at its table's width: a narrow table with a long caption would fold it.
        lines = [line for text in (table.title, table.caption) if isinstance(text, str) for line in text.splitlines()]
        widest = max((self.render_str(line).cell_len for line in lines), default=0)
        table.min_width = max(table.min_width or 0, widest)
        return table


def new_console(*, stderr: bool = False) -> Console:
    """A Console on stdout (or stderr) that wraps at the terminal's width, and never when not writing to one."""
    out = Console(stderr=stderr)
    if out.is_terminal:
        return out
    return _UnboundedConsole(stderr=stderr, width=UNBOUNDED)
