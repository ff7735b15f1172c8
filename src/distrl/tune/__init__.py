"""``distrl tune``: hyperparameter studies on Optuna (see :mod:`distrl.tune.study`) and population-based
training (:mod:`distrl.tune.pbt`).

Imports: :mod:`distrl.strategies` and :mod:`distrl.training` (a trial is a run) and everything below them;
only the command line imports it.
"""
