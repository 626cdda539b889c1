"""``python -m phasesweep._cli``: the ``phasesweep`` command."""

from phasesweep._cli import console

console()
