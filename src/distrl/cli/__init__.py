"""The ``distrl`` command: train, eval, export, collect, plot, trust, tune, bench.

User mistakes (a ConfigError) print one line on stderr and exit with status 2; a run that cannot write
its directory (a full disk), or an export whose graph does not act as the policy does, one line and status 1; a run stopped by a signal at its checkpoint one line and
128 + the signal's number. ``--debug`` shows the traceback as well. Each command's flags and work live in a module of its own
(``train``; ``runs`` for eval and plot; ``distrl.tune`` and ``distrl.cli.bench``), imported when it is asked for.

Imports: anything below it (strategies, the API, tune, export, and their layers); nothing imports it but
``python -m distrl``.
"""

from __future__ import annotations

import inspect
import os
import sys
import traceback

import tyro
import tyro._strings

from distrl._version import __version__
from distrl.config import ConfigError
from distrl.envs.short_names import SHORT_NAMES
from distrl.export import ExportFailed
from distrl.run.preemption import Stopped
from distrl.run.rundir import WriteFailed

ALGOS = ("ppo", "appo", "impala", "sac", "dqn", "reinforce", "grpo", "td3", "bc", "td3bc", "iql", "cql")


def _flowing_help() -> None:
    """Let each field's docstring flow into one paragraph of ``--help``.

    tyro joins a docstring's lines unless a line starts with something other than a letter, and the
    continuation lines of an attribute docstring start with the source's indentation: every help text
    broke at the source's line ends. Removing the common indentation first (``inspect.cleandoc``) lets
    them join; a blank line still starts a new paragraph.

    tyro has no public hook for this, so its joining function is wrapped in place; pyproject.toml pins tyro
    to the minor version this was written against, and ``tests/cli/test_cli.py`` checks the wording of
    ``--help`` so that an upgrade that moves the function is caught there, not by users.
    """
    join = tyro._strings.remove_single_line_breaks
    if getattr(join, "flows", False):  # already wrapped: main() imported twice in one process
        return

    def flowing(text: str) -> str:
        return join(inspect.cleandoc(text))

    flowing.flows = True  # type: ignore[attr-defined]
    tyro._strings.remove_single_line_breaks = flowing


_flowing_help()

USAGE = """\
usage: distrl COMMAND ...

  distrl train ALGO ENV [flags]     train an agent; `distrl train ppo cartpole --help` lists the flags
  distrl eval RUN [flags]           evaluate a run directory or checkpoint; --record FILE.gif|.mp4
  distrl export RUN [flags]         the policy as one ONNX (--format onnx) or TorchScript graph, checked
  distrl collect RUN --out ID       play a run's policy into a Minari dataset (--steps N, --epsilon E,
                                    --stochastic, --random, --every-checkpoint)
  distrl plot RUN [RUN ...] [flags] reward curves from Monitor files (distrl's or stable-baselines3's)
  distrl trust RUN [RUN ...]        let a run from elsewhere import the code its config names
  distrl tune ALGO ENV [flags]      an Optuna study of ALGO's hyperparameters on ENV; writes best.json,
                                    a preset (distrl train ALGO ENV --preset best.json); --scheduler pbt:
                                    population-based training on Ray Tune
  distrl tune report STUDY_DIR      a PBT study's results again: lineage and schedule plots, best.json
  distrl tune replay STUDY_DIR      the best PBT member's hyperparameter schedule, trained as one run
  distrl bench scaling ALGO ENV     the same training with 1, 2, ... workers, speedup against ideal

  distrl --version                  the installed version

ALGO: {algos}
ENV:  a Gymnasium id (CartPole-v1, Hopper-v5, ALE/Breakout-v5, ...), a short name
{short_names},
      package.module:ClassName (a gymnasium.Env subclass) or package.module:function
      (returning a gymnasium.Env); for grpo a language model, which needs no ENV:
      distrl train grpo --model DIR --dataset FILE.jsonl --reward NAME [--strategy pipeline],
      or a numeric group task: toy or bandit (distrl train grpo bandit --strategy pipeline)
"""


def usage() -> str:
    """The top-level help, listing every short name distrl resolves."""
    lines, line = [], "     "
    for name in SHORT_NAMES:
        if len(line) + len(name) + 2 > 90:
            lines.append(line.rstrip())
            line = "     "
        line += f" {name},"
    lines.append(line.rstrip(","))
    return USAGE.format(algos=", ".join(ALGOS), short_names="\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--debug" in argv:  # the workers it starts see it too: libraries' banners stay on
        os.environ["DISTRL_DEBUG"] = "1"
    try:
        return _dispatch(argv)
    except ConfigError as exc:
        if "--debug" in argv:
            traceback.print_exc()
        print(f"distrl: error: {exc}", file=sys.stderr)
        return 2
    except (WriteFailed, ExportFailed) as exc:
        if "--debug" in argv:
            traceback.print_exc()
        print(f"distrl: error: {exc}", file=sys.stderr)
        return 1
    except Stopped as exc:
        if str(exc):
            print(f"distrl: {exc}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print("distrl: interrupted", file=sys.stderr)
        return 130


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("--version", "-V"):
        print(f"distrl {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command == "train":
        if not rest or rest[0] in ("-h", "--help"):
            print(usage())
            return 0
        from distrl.cli.train import train_command

        return train_command(rest)
    if command == "eval":
        from distrl.cli.runs import eval_command

        return eval_command(rest)
    if command == "export":
        from distrl.cli.runs import export_command

        return export_command(rest)
    if command == "collect":
        from distrl.cli.collect import collect_command

        return collect_command(rest)
    if command == "trust":
        from distrl.cli.runs import trust_command

        return trust_command(rest)
    if command == "plot":
        from distrl.cli.runs import plot_command

        return plot_command(rest)
    if command == "tune":
        from distrl.tune.study import tune_command

        return tune_command(rest)
    if command == "bench":
        if not rest or rest[0] != "scaling":
            raise ConfigError(
                f"bench={rest[0] if rest else ''!r} is not known: must be scaling "
                "(distrl bench scaling ALGO ENV --workers 1,2)"
            )
        from distrl.cli.bench import scaling_command

        return scaling_command(rest[1:])
    raise ConfigError(
        f"command={command!r} is not known: must be one of train, eval, export, collect, plot, trust, tune, bench, --version"
    )
