"""``distrl tune``: hyperparameter studies on Optuna (see :mod:`distrl.tune.study`)."""
