"""What a run leaves behind and how it stops: the run directory and its lock (``rundir``), checkpoints
(``checkpoint``), logs and summaries (``logs``), trackers (``tracking``), which runs may load the code
their config names (``trust``), stopping at a checkpoint on a signal (``preemption``), quiet consoles
(``quiet``) and plots (``plots``).

Imports: :mod:`distrl.config` only; every layer that writes or reads a run uses it.
"""
