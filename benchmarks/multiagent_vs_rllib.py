"""PPO with one shared policy on MPE2's simple_spread_v3: distrl against stable-baselines3 and RLlib, in one run.

    python benchmarks/multiagent_vs_rllib.py                  # seed 0; writes docs/results/multiagent_vs_rllib.json
                                                              # and its section of docs/benchmarks.md
    python benchmarks/multiagent_vs_rllib.py --seeds 0 1 2    # more seeds, the frameworks alternating
    python benchmarks/multiagent_vs_rllib.py --rows 256       # minibatches of 256 rows (the default is 768);
                                                              # writes docs/results/multiagent_vs_rllib-256.json
    python benchmarks/multiagent_vs_rllib.py --quick          # (or --smoke) 9,216 steps each, prints, writes nothing

Needs the bench and pettingzoo extras and RLlib: pip install -e ".[bench,pettingzoo]" 'ray[rllib]' 'gymnasium>=1.4'
(RLlib 2.60's extra pins gymnasium 1.2.2; its new API stack ran here with gymnasium 1.4, which Taxi-v4 needs).

All three train ``mpe2.simple_spread_v3`` (N=3 agents, ``continuous_actions=False``, ``max_cycles=25``: a game
always lasts 25 steps) with one policy for every agent, the parameter sharing of SuperSuit's vector envs: each
agent of each of 8 game copies is one row of a vector env, its observation the agent's own 18 numbers and a
one-hot of its index (21 inputs), and every row trains the same networks. The same PPO in all three: separate
64x64 tanh policy and value networks, orthogonal initialisation (gain sqrt(2) hidden, 0.01 policy output, 1 value
output, zero biases), 128 steps per rollout (8 x 3 x 128 = 3,072 rows), minibatches of 256 game steps (768 rows),
10 epochs, Adam lr 7e-4, gamma 0.99, GAE lambda 0.95, clip 0.2, entropy 0.01, value coefficient 0.5, gradient norm
clipped at 0.5, truncation bootstrapped, no value clipping, no KL term. Each trains ``--steps`` agent-steps (rows,
rounded up to whole rollouts; 300k by default, 98 rollouts), one process computing with one torch thread:

- distrl: ``distrl train ppo mpe2.simple_spread_v3 --env-kwargs N=3 continuous_actions=false max_cycles=25
  --preset none --device cpu --n-envs 8 --n-steps 128 --batch-size 256 --n-epochs 10 --learning-rate 0.0007
  --gamma 0.99 --gae-lambda 0.95 --clip-range 0.2 --ent-coef 0.01 --vf-coef 0.5 --max-grad-norm 0.5``
  (``--strategy single``; ``--n-envs`` counts game copies, ``--batch-size`` game steps). Its vector env resets a
  finished game on the next step, so one step in 26 of a copy's rows plays no game (masked out of the loss) and
  its step count includes them: the SPS below counts agent-steps played in games (steps less 3 per finished game).
- stable-baselines3: ``PPO("MlpPolicy")`` with 24 rows, ``batch_size`` 768, on SuperSuit's ``agent_indicator_v0``
  -> ``pettingzoo_env_to_vec_env_v1`` -> ``concat_vec_envs_v1(8, base_class="gymnasium")`` (the recipe of
  PettingZoo's SB3 tutorial). SuperSuit 3.11's own SB3 adapter (``base_class="stable_baselines3"``) is broken with
  SB3 2.9: seeding the model calls ``seed()`` on SuperSuit's ConcatVecEnv, which as a Gymnasium 1.x vector env has
  none (AttributeError). It also folds truncation into ``done``, so SB3 would not bootstrap the 25-step cut as
  distrl and RLlib do. :func:`sb3_rows` below builds the adapter used instead: it seeds at reset and marks truncated
  rows ``TimeLimit.truncated``, so that SB3 bootstraps them from the final observation.
- RLlib: PPO on the new API stack (RLModule, Learner, EnvRunner; Ray 2.60's default), ``ParallelPettingZooEnv``
  over the same env with ``agent_indicator_v0``, one policy ``shared`` mapped to every agent,
  ``num_envs_per_env_runner=8``, ``train_batch_size_per_learner`` 1,024 (game steps: 128 per env),
  ``minibatch_size`` 768 (rows of the shared module). ``num_env_runners=0`` and ``num_learners=0``: sampling and
  learning both run in the driver process, on ``ray.init(num_cpus=1)``; Ray's own processes (GCS, raylet and the
  workers it starts) run beside it and count in its memory. Its PPO catalog takes no initializer for the output
  layers, so they are set after the build (:func:`_orthogonal_heads`).

``--rows 256``: minibatches of 256 rows, as a user would set them in SB3 and RLlib (12 a rollout). distrl's
``--batch-size`` counts game steps, and 256 rows are not a whole number of 3-agent game steps: distrl takes 64
game steps (192 rows, 16 minibatches a rollout), the largest batch that divides its rollout within 256 rows. So it
takes a third more gradient steps than the others, which only counts against its SPS.

Differences that remain: SB3 normalises advantages per minibatch, distrl and RLlib over the whole rollout;
RLlib's Adam has eps 1e-8 (distrl and SB3: 1e-5); RLlib's batch also holds one masked bootstrap row per agent and
episode fragment (~5% more rows, so ~42 minibatches of 768 rows per rollout where distrl and SB3 take 40).

Figures per framework: SPS (agent-steps played in games per second of training, start-up excluded: distrl's
``train_s``, the time in SB3's ``learn`` and in RLlib's ``train()`` calls) and per second of the whole process
(interpreter start to exit, distrl's final evaluation left out; Ray's start and stop are large); training seconds
until the mean team return (the 3 agents' returns summed) of the last 100 games first reaches ``--target``; the
peak RSS of the process and every process under it (sampled every 0.5 s). A game counts when it ends: SB3 and
RLlib stamp it then, distrl when its iteration is logged (after the update, so up to one iteration late). The
default target, -62, is where seed 0 of distrl and SB3 both got to at about a third of the budget; both level off
near -58 to -60 by 300k agent-steps, so a higher target would time the noise of the plateau. Ratios are
distrl / other, of medians over the seeds: above 1 for SPS and below 1 for time to target, distrl is faster.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from harness import PeakMemory, alternating, child_env, child_main, markdown_table, median, write_section

RESULT = Path(__file__).parents[1] / "docs" / "results" / "multiagent_vs_rllib.json"
ENV = "mpe2.simple_spread_v3"
ENV_KWARGS = {"N": 3, "continuous_actions": False, "max_cycles": 25}
N_AGENTS = 3
HP = dict(
    game_copies=8,
    n_steps=128,
    batch_size=256,  # game steps: minibatches of 768 rows (see minibatches for --rows)
    n_epochs=10,
    learning_rate=7e-4,
    gamma=0.99,
    gae_lambda=0.95,
    clip_range=0.2,
    ent_coef=0.01,
    vf_coef=0.5,
    max_grad_norm=0.5,
)
NET_ARCH = (64, 64)
ROLLOUT = HP["game_copies"] * N_AGENTS * HP["n_steps"]
"""Agent-steps (rows) per rollout."""
LIBS = ("distrl", "sb3", "rllib")
NAMES = {"distrl": "distrl", "sb3": "stable-baselines3", "rllib": "RLlib"}
WINDOW = 100
"""Games in the running mean that has to reach the target."""
TIMEOUT_S = 1800.0
"""Longest a single run may take; a full run takes a few minutes."""


def minibatches(rows: int) -> tuple[int, int]:
    """(distrl's ``--batch-size`` in game steps, SB3's and RLlib's minibatch in rows) for minibatches of ``rows``
    rows: the largest game-step batch that divides distrl's rollout and holds at most ``rows`` rows."""
    game_steps = HP["game_copies"] * HP["n_steps"]
    distrl = max(d for d in range(1, game_steps + 1) if game_steps % d == 0 and d * N_AGENTS <= rows)
    return distrl, rows


def _parallel_env() -> Any:
    """The game as SB3 and RLlib see it: each agent's observation with the one-hot of its index appended."""
    import supersuit
    from mpe2 import simple_spread_v3

    return supersuit.agent_indicator_v0(simple_spread_v3.parallel_env(**ENV_KWARGS))


# ---------------------------------------------------------------- children: SB3 and RLlib, one run each


def child(lib: str, seed: int, steps: int, rows: int) -> dict:
    """Train ``steps`` agent-steps in minibatches of ``rows`` rows: the training seconds, the agent-steps taken and
    every game's (seconds into training when it ended, team return)."""
    import torch

    torch.set_num_threads(1)
    return _sb3(seed, steps, rows) if lib == "sb3" else _rllib(seed, steps, rows)


def sb3_rows(venv: Any) -> Any:
    """``venv`` as an :class:`SB3Rows` (a class built on call: the parent and RLlib's child do not import SB3)."""
    from stable_baselines3.common.vec_env import VecEnv

    class SB3Rows(VecEnv):
        """SuperSuit's Gymnasium vector env of agent rows (``concat_vec_envs_v1(..., base_class="gymnasium")``) as a
        stable-baselines3 VecEnv: the seed given to ``seed()`` reaches the next reset, truncated rows carry
        ``TimeLimit.truncated`` (SB3 then bootstraps them from ``terminal_observation``, which SuperSuit sets), and
        every finished game is logged in ``games`` as (``time.perf_counter()``, team return)."""

        def __init__(self, venv: Any):
            self.venv = venv
            super().__init__(venv.num_envs, venv.observation_space, venv.action_space)
            self.returns = np.zeros(venv.num_envs)
            self.games: list[tuple[float, float]] = []

        def reset(self) -> np.ndarray:
            obs, self.reset_infos = self.venv.reset(seed=self._seeds[0])
            self._reset_seeds()
            self.returns[:] = 0.0
            return obs

        def step_async(self, actions: np.ndarray) -> None:
            self.actions = actions

        def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict]]:
            obs, rewards, terminated, truncated, infos = self.venv.step(self.actions)
            terminated, truncated = terminated.astype(bool), truncated.astype(bool)
            for row in np.flatnonzero(truncated & ~terminated):
                infos[row]["TimeLimit.truncated"] = True
            done = terminated | truncated
            self.returns += rewards
            now = time.perf_counter()
            for game in np.flatnonzero(done.reshape(-1, N_AGENTS).all(1)):  # simple_spread's agents end together
                self.games.append((now, float(self.returns[game * N_AGENTS : (game + 1) * N_AGENTS].sum())))
            self.returns[done] = 0.0
            return obs, rewards, done, infos

        def close(self) -> None:
            self.venv.close()

        def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
            return [getattr(self.venv, attr_name)] * self.num_envs

        def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
            raise NotImplementedError("SB3Rows holds no env per row")

        def env_method(self, method_name: str, *args: Any, indices: Any = None, **kwargs: Any) -> list[Any]:
            raise NotImplementedError("SB3Rows holds no env per row")

        def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
            return [False] * self.num_envs

    return SB3Rows(venv)


def _sb3(seed: int, steps: int, rows: int) -> dict:
    import supersuit
    from stable_baselines3 import PPO
    from torch import nn

    venv = supersuit.concat_vec_envs_v1(
        supersuit.pettingzoo_env_to_vec_env_v1(_parallel_env()), HP["game_copies"], num_cpus=0, base_class="gymnasium"
    )
    agent_rows = sb3_rows(venv)
    hp = {k: v for k, v in HP.items() if k != "game_copies"}
    hp["batch_size"] = rows
    model = PPO(
        "MlpPolicy",
        agent_rows,
        **hp,
        policy_kwargs=dict(net_arch=dict(pi=list(NET_ARCH), vf=list(NET_ARCH)), activation_fn=nn.Tanh, ortho_init=True),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    start = time.perf_counter()
    model.learn(steps)
    train_s = time.perf_counter() - start
    games = [(t - start, r) for t, r in agent_rows.games]
    return {"train_s": train_s, "agent_steps": model.num_timesteps, "games": games}


def _rllib(seed: int, steps: int, rows: int) -> dict:
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv
    from ray.tune.registry import register_env

    # address="local": a new instance, never a stale cluster's (docs: PERFORMANCE.md, "Ray")
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    register_env("simple_spread", lambda _: ParallelPettingZooEnv(_parallel_env()))
    games: list[tuple[float, float]] = []

    def game_ended(episode: Any, prev_episode_chunks: list[Any], **_: Any) -> None:
        """Log the game's (time, team return). ``episode`` is only the game's last chunk (RLlib cuts episodes at
        every ``sample()``), the chunks before it come as ``prev_episode_chunks``. A closure, not a partial: RLlib
        deep-copies its config, and a partial's list with it."""
        team_return = episode.get_return() + sum(chunk.get_return() for chunk in prev_episode_chunks)
        games.append((time.perf_counter(), team_return))

    # the hidden layers as distrl's and SB3's; RLlib 2.60's PPO catalog passes no initializer to its output
    # layers, which _orthogonal_heads sets after the build
    init = {
        "fcnet_kernel_initializer": "orthogonal_",
        "fcnet_kernel_initializer_kwargs": {"gain": math.sqrt(2)},
        "fcnet_bias_initializer": "zeros_",
    }
    config = (
        PPOConfig()
        .environment("simple_spread")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=HP["game_copies"], rollout_fragment_length="auto")
        .learners(num_learners=0)
        .multi_agent(policies={"shared"}, policy_mapping_fn=lambda agent_id, *args, **kwargs: "shared")
        .rl_module(
            rl_module_spec=MultiRLModuleSpec(rl_module_specs={"shared": RLModuleSpec()}),
            model_config={
                "fcnet_hiddens": list(NET_ARCH),
                "fcnet_activation": "tanh",
                "vf_share_layers": False,
                **init,
            },
        )
        .training(
            train_batch_size_per_learner=HP["game_copies"] * HP["n_steps"],  # game steps
            minibatch_size=rows,  # rows of the shared module
            num_epochs=HP["n_epochs"],
            lr=HP["learning_rate"],
            gamma=HP["gamma"],
            lambda_=HP["gae_lambda"],
            clip_param=HP["clip_range"],
            entropy_coeff=HP["ent_coef"],
            vf_loss_coeff=HP["vf_coef"],
            grad_clip=HP["max_grad_norm"],
            grad_clip_by="global_norm",
            use_kl_loss=False,
            kl_coeff=0.0,
            vf_clip_param=float("inf"),
        )
        .callbacks(on_episode_end=game_ended)
        .debugging(seed=seed)
    )
    algo = config.build_algo()
    algo.learner_group.foreach_learner(_orthogonal_heads)
    algo.env_runner_group.sync_weights(from_worker_or_learner_group=algo.learner_group, inference_only=True)
    start, agent_steps, train_s = time.perf_counter(), 0, 0.0  # games end only while train() samples
    while agent_steps < steps:
        began = time.perf_counter()
        result = algo.train()
        train_s += time.perf_counter() - began
        agent_steps = int(sum(result["env_runners"]["num_agent_steps_sampled_lifetime"].values()))
    algo.stop()
    ray.shutdown()
    return {"train_s": train_s, "agent_steps": agent_steps, "games": [(t - start, r) for t, r in games]}


def _orthogonal_heads(learner: Any) -> None:
    """The policy and value output layers of RLlib's shared module initialised as distrl's and SB3's: orthogonal
    with gain 0.01 and 1, zero bias (in place, before the first step: Adam holds these tensors, with no state yet)."""
    from torch import nn

    module = learner.module["shared"]
    for head, gain in ((module.pi, 0.01), (module.vf, 1.0)):
        (layer,) = head.net.mlp
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)


# ---------------------------------------------------------------- parent: launch, measure, report


def launch(command: list[str], label: str, root: Path) -> tuple[str, float, float]:
    """Run ``command`` with src/ and benchmarks/ on its path, its process tree's memory sampled: its stdout, its
    wall time and its tree's peak RSS (MB). A run past TIMEOUT_S is killed, with every process under it, and
    reported by ``label``."""
    out_path, err_path = root / f"{label}.stdout", root / f"{label}.stderr"
    with open(out_path, "w") as out, open(err_path, "w") as err:  # files, not pipes: a full pipe stalls a run
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err, env=child_env())
        memory = PeakMemory([proc.pid])
        try:
            code = proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for process in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
                with contextlib.suppress(psutil.NoSuchProcess):  # it ended by itself meanwhile
                    process.kill()  # Ray's processes too
            proc.wait()
            code = f"killed after {TIMEOUT_S:.0f} s"
        memory.close()
        wall_s = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"{label} failed ({code}):\n{err_path.read_text()[-3000:]}")
    return out_path.read_text(), wall_s, memory.tree_mb


def run_distrl(seed: int, steps: int, rows: int, root: Path) -> dict:
    run_dir = root / f"distrl-s{seed}"
    flags = {
        "--preset": "none",
        "--device": "cpu",
        "--n-envs": HP["game_copies"],
        **{f"--{k.replace('_', '-')}": v for k, v in HP.items() if k != "game_copies"},
        "--batch-size": minibatches(rows)[0],
        "--total-steps": steps,
        "--seed": seed,
        # the final evaluation cannot be turned off: one short one, left out of the process time below
        "--eval-episodes": 1,
        "--eval-max-steps": 100,
    }
    args = ["ppo", ENV, "--env-kwargs", *(f"{k}={str(v).lower()}" for k, v in ENV_KWARGS.items())]
    args += [str(x) for flag, value in flags.items() for x in (flag, value)]
    command = [sys.executable, "-m", "distrl", "train", *args, "--quiet", "--run-dir", str(run_dir)]
    _, wall_s, tree_mb = launch(command, f"distrl-s{seed}", root)
    summary = json.loads((run_dir / "summary.json").read_text())
    lines = (run_dir / "monitor.csv").read_text().splitlines()[1:]  # after the JSON header line
    games = [(float(row["t"]), float(row["r"])) for row in csv.DictReader(lines)]
    return {
        "train_s": summary["train_s"],
        "process_s": wall_s - summary["final_eval_s"],
        "agent_steps": summary["total_steps"],
        "game_agent_steps": summary["total_steps"] - N_AGENTS * len(games),  # each game's reset step
        "tree_rss_mb": tree_mb,
        "games": games,
        "distrl_sps": summary["sps"],
    }


def run_reference(lib: str, seed: int, steps: int, rows: int, root: Path) -> dict:
    command = [sys.executable, __file__, "--child", lib, str(rows), str(seed), str(steps)]
    stdout, wall_s, tree_mb = launch(command, f"{lib}-s{seed}", root)
    result = json.loads(stdout.strip().splitlines()[-1])
    result.update(process_s=wall_s, game_agent_steps=result["agent_steps"], tree_rss_mb=tree_mb)
    return result


def to_target(games: list[tuple[float, float]], target: float) -> tuple[float | None, int | None]:
    """Training seconds and games played when the mean return of the last WINDOW games first reaches ``target``."""
    returns = np.array([r for _, r in games])
    if len(returns) < WINDOW:
        return None, None
    means = np.convolve(returns, np.ones(WINDOW) / WINDOW, mode="valid")
    reached = np.flatnonzero(means >= target)
    if not len(reached):
        return None, None
    last = int(reached[0]) + WINDOW - 1
    return games[last][0], last + 1


def figures(r: dict, target: float) -> dict:
    """One run's figures, its raw game log reduced to the running mean every WINDOW games."""
    seconds, played = to_target(r["games"], target)
    returns = [g[1] for g in r["games"]]
    curve = [
        [round(r["games"][i - 1][0], 2), round(float(np.mean(returns[i - WINDOW : i])), 2)]
        for i in range(WINDOW, len(returns) + 1, WINDOW)
    ]
    out = {
        "sps": r["game_agent_steps"] / r["train_s"],
        "sps_process": r["game_agent_steps"] / r["process_s"],
        "startup_s": r["process_s"] - r["train_s"],
        "s_to_target": seconds,
        "games_to_target": played,
        "last_100": float(np.mean(returns[-WINDOW:])) if returns else None,
        "games": len(returns),
        "tree_rss_mb": r["tree_rss_mb"],
        "train_s": r["train_s"],
        "process_s": r["process_s"],
        "agent_steps": r["agent_steps"],
        "game_agent_steps": r["game_agent_steps"],
        "curve_s_mean100": curve,
    }
    if "distrl_sps" in r:
        out["distrl_sps"] = r["distrl_sps"]
    return out


def main() -> None:
    if child_main(lambda lib, rows, seed, steps: child(lib, seed, int(steps), int(rows))):
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", "--smoke", action="store_true", help="tiny budgets; prints, writes nothing")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="the same seeds for every framework")
    parser.add_argument("--steps", type=int, default=300_000, help="agent-steps (rows) per run")
    parser.add_argument("--target", type=float, default=-62.0, help="mean team return of the last 100 games")
    parser.add_argument("--rows", type=int, default=768, help="minibatch rows (agent-steps); see the docstring")
    args = parser.parse_args()
    seeds = args.seeds[:1] if args.quick else args.seeds
    steps = math.ceil((3 * ROLLOUT if args.quick else args.steps) / ROLLOUT) * ROLLOUT
    machine = f"{os.cpu_count()} CPUs, {platform.machine()}, {platform.platform()}, Python {platform.python_version()}"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{machine}; load average at start {load}; {steps:,} agent-steps per run", flush=True)
    runs: dict[str, list[dict]] = {lib: [] for lib in LIBS}
    with tempfile.TemporaryDirectory() as tmp:
        for i, lib in enumerate(alternating(list(LIBS), len(seeds))):
            seed = seeds[i // len(LIBS)]
            if lib == "distrl":
                raw = run_distrl(seed, steps, args.rows, Path(tmp))
            else:
                raw = run_reference(lib, seed, steps, args.rows, Path(tmp))
            r = dict(figures(raw, args.target), seed=seed)
            runs[lib].append(r)
            reached = "not reached" if r["s_to_target"] is None else f"{r['s_to_target']:.1f} s"
            print(
                f"  {NAMES[lib]} seed {seed}: {r['sps']:,.0f} SPS ({r['sps_process']:,.0f} whole process), "
                f"target {reached}, last 100 games {r['last_100']:.1f}, peak RSS {r['tree_rss_mb']:,.0f} MB",
                flush=True,
            )
    data = {
        "command": "python benchmarks/multiagent_vs_rllib.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine,
        "load_at_start": load,
        "env": ENV,
        "env_kwargs": ENV_KWARGS,
        "hyperparameters": dict(HP, net_arch=NET_ARCH),
        "minibatch_rows": dict(zip(("distrl", "others"), (minibatches(args.rows)[0] * N_AGENTS, args.rows))),
        "agent_steps": steps,
        "target": args.target,
        "seeds": seeds,
        "versions": versions(),
        "runs": runs,
    }
    data["medians"] = {lib: {k: median([r[k] for r in rs]) for k in MEASURES} for lib, rs in runs.items()}
    data["ratios"] = ratios(data["medians"])
    body = "\n".join(report(data))
    if args.quick:
        print(body)
    else:
        default = args.rows == 768
        result = RESULT if default else RESULT.with_name(f"{RESULT.stem}-{args.rows}.json")
        result.write_text(json.dumps(data, indent=1) + "\n")
        title = "Multi-agent PPO: distrl against stable-baselines3 and RLlib"
        write_section(title if default else f"{title}, {args.rows}-row minibatches", body)


MEASURES = ("sps", "sps_process", "startup_s", "s_to_target", "tree_rss_mb", "last_100")


def ratios(medians: dict[str, dict]) -> dict[str, dict]:
    """distrl / other for SPS (both ways) and time to target; None where either is missing."""

    def ratio(lib: str, key: str) -> float | None:
        d, o = medians["distrl"][key], medians[lib][key]
        return d / o if d and o else None

    return {lib: {key: ratio(lib, key) for key in ("sps", "sps_process", "s_to_target")} for lib in LIBS[1:]}


def versions() -> dict[str, str]:
    from importlib.metadata import version

    packages = ("distrl", "stable-baselines3", "supersuit", "ray", "torch", "gymnasium", "pettingzoo", "mpe2")
    return {p: version(p) for p in packages}


def report(data: dict) -> list[str]:
    """The table of a result of this benchmark (as written to docs/results/multiagent_vs_rllib.json)."""

    def show(value: float | None, digits: int = 0) -> str:
        return "n/a" if value is None else f"{value:,.{digits}f}"

    rows = []
    for lib, m in data["medians"].items():
        rows.append(
            [
                NAMES[lib],
                show(m["sps"]),
                show(m["sps_process"]),
                show(m["startup_s"], 1),
                show(m["s_to_target"], 1),
                f"{sum(r['s_to_target'] is not None for r in data['runs'][lib])}/{len(data['runs'][lib])}",
                show(m["last_100"], 1),
                show(m["tree_rss_mb"]),
            ]
        )
    ratio_rows = [
        [f"distrl / {NAMES[lib]}", show(q["sps"], 2), show(q["sps_process"], 2), show(q["s_to_target"], 2)]
        for lib, q in data["ratios"].items()
    ]
    v = data["versions"]
    mb = data.get("minibatch_rows", {"distrl": 768, "others": 768})
    minibatch = (
        f"minibatches of {mb['others']} rows"
        if mb["distrl"] == mb["others"]
        else f"minibatches of {mb['others']} rows ({mb['distrl']} for distrl, whose batches are whole game steps)"
    )
    return [
        f"`{data['command'].strip()}` — {data['date']}, {data['machine']}, load average at start "
        f"{data['load_at_start']}. PPO with one shared policy on `{ENV}` (N=3, discrete actions, 25-step games), "
        f"{data['agent_steps']:,} agent-steps per run, {minibatch}, seeds {data['seeds']}, frameworks alternating; "
        f"distrl {v['distrl']}, stable-baselines3 {v['stable-baselines3']} on SuperSuit {v['supersuit']}, "
        f"RLlib {v['ray']} (new API stack, sampling and learning in the driver, `ray.init(num_cpus=1)`), torch "
        f"{v['torch']}. Same network and hyperparameters in all three: see the script's docstring.",
        "",
        *markdown_table(
            [
                "framework",
                "SPS (training)",
                "SPS (whole process)",
                "start-up s",
                f"training s to mean of last 100 games ≥ {data['target']:g}",
                "runs reaching it",
                "last 100 games",
                "peak RSS, process tree (MB)",
            ],
            rows,
        ),
        "",
        *markdown_table(["ratio", "SPS (training)", "SPS (whole process)", "time to target"], ratio_rows),
        "",
        "SPS counts agent-steps played in games (distrl's reset steps left out). Start-up: the process's wall time "
        "less its training time (imports, env and network building; Ray's start and stop for RLlib; distrl's final "
        "evaluation left out). Ratios are of medians: above 1 for SPS, below 1 for time, distrl is faster.",
    ]


if __name__ == "__main__":
    main()
