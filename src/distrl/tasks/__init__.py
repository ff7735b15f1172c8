"""Group tasks for GRPO: what the policy is asked and how its completions are scored.

The numeric tasks and the protocol every task follows (``group``), prompts from a JSONL dataset
(``prompts``), multi-turn text environments and their built-in adapters (``text_envs``,
``text_adapters``), reward functions and the built-ins (``rewards``, ``builtin_rewards``), reward
workers that keep a hanging reward from hanging the run (``reward_workers``) and keyed random streams
(``streams``).

Imports: :mod:`distrl.config` and :mod:`distrl.envs` (env names); never data, nets, algos or above.
"""
