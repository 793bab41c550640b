"""The per-layer quantization report of the stages under ``paths.checkpoints``.

    python -m mdk.tools.quant_report model=gnetdet dataset=voc dist.gpus=2

Takes the overrides of ``python run.py`` and runs the report stage (conf/step/quant_report.yaml)
through ``run.py``, so the run dir, processes, SLURM, stop signals and one-line errors are the
launcher's. What it writes and what the columns mean: docs/pipeline.md, "Finding where accuracy
goes".
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn, Optional, Sequence

REPORT_STAGE = "quant_report"  # conf/step/quant_report.yaml: the report as a stage of run.py
RUN_PY = Path(__file__).resolve().parents[2] / "run.py"


def command(overrides: Sequence[str]) -> list[str]:
    """The ``run.py`` command line of the report with ``overrides``."""
    bad = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in ("step", "pipeline")]
    if bad:
        raise ValueError(f"{bad[0]}: the report is its own stage; leave step and pipeline out "
                         "(it reads every stage's checkpoint under paths.checkpoints)")
    return [sys.executable, str(RUN_PY), f"step={REPORT_STAGE}", *overrides]


def main(argv: Optional[Sequence[str]] = None) -> NoReturn:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0)
    try:
        argv_run = command(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    if not RUN_PY.is_file():
        print(f"error: {RUN_PY} is missing: run the tool from a checkout of the repository",
              file=sys.stderr)
        sys.exit(1)
    sys.stdout.flush()
    os.execv(sys.executable, argv_run)  # run.py takes over this process (signals, exit status)


if __name__ == "__main__":
    main()
