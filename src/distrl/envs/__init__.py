"""Environments: what a name means and how an env is built, stepped, recorded and evaluated.

Names and entry points (``names``), vector envs and Gymnasium's autoreset (``vector``, the one place it is handled;
``one_env``, its single-env fast path), observation and action spaces (``spaces``), action masks (``masks``), Atari
preprocessing (``atari``) and envpool (``envpool``), PettingZoo games as vector envs of their agents
(``pettingzoo``, ``multiagent``), self-play opponents and search players (``selfplay``, ``search_players``), greedy
evaluation (``evaluation``) and videos (``video``). Imports: :mod:`distrl.config` only, beside Gymnasium and numpy;
the layers above (data, nets, algos, training, strategies, cli) build on it, never the reverse.
"""
