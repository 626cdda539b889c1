"""Faults injected into trials that run in Ray workers, through the package's one seam
(:data:`pipeline.run._trial.HOOKS_ENV` names this file; :func:`env` gives the variables).

- :data:`FAULT_ENV`: run ids whose training raises (comma-separated, or ``*`` for all),
  for retries and the ``failed`` status;
- :data:`HOLD_ENV`: a file; while it exists, a trial that has just written a checkpoint
  waits there (still reporting progress and obeying a stop). It lets a fault test kill or
  interrupt a launch while several chunks are known to be mid-training, whatever the
  machine's load (without it, a loaded machine may start the second trial only after the
  first chunk has finished).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from phasesweep.pipeline.run._trial import HOOKS_ENV

FAULT_ENV = "PHASESWEEP_INJECT_FAILURE"
HOLD_ENV = "PHASESWEEP_HOLD_AFTER_CHECKPOINT"


def env(**variables: str) -> dict[str, str]:
    """``variables`` plus the seam's variable naming this file."""
    return {HOOKS_ENV: str(Path(__file__).resolve()), **variables}


def before_training(run_ids: Sequence[str]) -> None:
    targets = {s for s in os.environ.get(FAULT_ENV, "").split(",") if s}
    if "*" in targets or targets.intersection(run_ids):
        raise RuntimeError(f"{FAULT_ENV} injected a failure into this chunk")


def after_checkpoint(step: int, hook) -> bool:  # noqa: ANN001
    """Wait while the :data:`HOLD_ENV` file exists; True if the launch stopped meanwhile."""
    hold = os.environ.get(HOLD_ENV)
    while hold and os.path.exists(hold):
        if hook.stopped():
            return True
        hook.progress(step)
        time.sleep(0.2)
    return False
