"""The launcher process of ``attribution-audit run --workers N``: torch's launcher (torchrun) in a
process of its own, so that what it does to its process (``OMP_NUM_THREADS=1`` and other variables
set in ``os.environ``, signal handlers, a rendezvous store) never reaches the caller's.

Run as ``python -m audit.run.launcher REPORT WORKERS ARGS...``: starts ``WORKERS`` ranks of
``python -m audit ARGS...``; when a rank fails, writes ``{"rank", "exitcode"}`` of the earliest failure
to the JSON file ``REPORT`` and exits with 1.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    report, workers, rest = Path(argv[0]), int(argv[1]), argv[2:]
    args = get_args_parser().parse_args(["--standalone", f"--nproc-per-node={workers}", "--module", "audit", *rest])
    try:
        run(args)  # type: ignore[no-untyped-call]
    except ChildFailedError as exc:
        rank, first = exc.get_first_failure()  # the earliest: the others often fail because it did
        report.write_text(json.dumps({"rank": rank, "exitcode": first.exitcode}))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
