"""``python -m prunefx.pipeline CONFIG [key=value ...]``: a pipeline config without the CLI, e.g. one per rank.

    torchrun --nproc_per_node 4 -m prunefx.pipeline configs/imagefolder.yaml dataset.root=/data/x

Errors print one ``error:`` line and exit with code 2, as the ``prunefx`` command does.
"""

from __future__ import annotations

import sys

from prunefx._io import storage_error
from prunefx.errors import PrunefxError
from prunefx.pipeline import run_config
from prunefx.train.distributed import shutdown


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    try:
        run_config(argv[0], argv[1:])
    except (PrunefxError, OSError) as exc:
        error = storage_error(exc)  # a full or read-only disk: one line naming the path and the fix
        if error is None and not isinstance(exc, PrunefxError):
            raise  # another OSError is not the user's to fix here: keep its traceback
        print(f"error: {error or exc}", file=sys.stderr)
        return 2
    finally:
        shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
