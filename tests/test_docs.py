"""The commands the docs show work as shown: every ``distrl train`` line in a fenced bash block of the README and
docs/ parses and passes the checks made before a run starts (an offline algorithm's on a dataset of its env made
for it), and the ``eval``, ``export``, ``collect`` and ``plot`` lines run on a small real run. A line that names code or files only its reader has (``mypkg``, ``./my-model``, ``RUN`` of a
multi-agent game) is left out, and the test says how many it checked, so that it cannot quietly check nothing."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from distrl.cli import main
from distrl.config import OFFLINE_CONFIGS

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
READERS_OWN = ("mypkg", "./my-model", "prompts.jsonl", "DIR", "FILE", "HEAD:", "OTHER_RUN", "--opponent", "best.json")
"""What marks a line as needing the reader's own code, files or runs."""


def commands(page: Path) -> list[str]:
    """The ``distrl ...`` commands of a page's fenced bash blocks, one per line (continuations joined, comments
    and a leading ``pip install ... &&`` or ``torchrun ... -m`` dropped)."""
    found = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", page.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith("#") or "distrl " not in line:
                continue
            found.append(line[line.index("distrl ") :])
    return found


ALL = [(page.name, command) for page in PAGES for command in commands(page)]


def argv_of(command: str) -> list[str]:
    return shlex.split(command)[1:]


def test_the_docs_show_commands_of_every_kind():
    kinds = {argv_of(command)[0] for _, command in ALL}
    assert {"train", "eval", "export", "plot", "tune", "bench"} <= kinds
    checked = [c for _, c in ALL if argv_of(c)[0] == "train" and not any(mark in c for mark in READERS_OWN)]
    assert len(checked) >= 50, len(checked)  # the train lines below are most of them


TRAIN = [(page, c) for page, c in ALL if argv_of(c)[0] == "train" and not any(mark in c for mark in READERS_OWN)]


@pytest.mark.parametrize(("page", "command"), TRAIN, ids=[f"{p}:{c[13:60]}" for p, c in TRAIN])
def test_every_train_command_in_the_docs_parses_and_passes_the_checks_before_a_run(
    page, command, tmp_path, monkeypatch, capsys
):
    import distrl.cli.start as start

    started = []
    monkeypatch.setattr(start, "start_run", lambda algo, run, strategy, cfg, resume, argv: started.append(run) or 0)
    monkeypatch.setattr(start, "run_ddp", lambda *args: started.append(args[0]))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")  # the reader's own key otherwise
    argv = argv_of(command)
    if "--resume" in argv:  # a run to continue: the docs' own command, made first with the same settings
        return  # a resumed run's command is tested with the run it continues (tests/run/test_preemption.py)
    if "--init-from" in argv:  # online from an offline run: tested with one (tests/training/test_offline_training.py)
        return
    if "--help" in argv:
        with pytest.raises(SystemExit) as shown:
            main(argv)
        assert shown.value.code == 0 and "--n-steps" in capsys.readouterr().out
        return
    if "--dataset" in argv and argv[1] in OFFLINE_CONFIGS:  # the dataset the line names, made of the line's env
        monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
        random_dataset(argv[2], argv[argv.index("--dataset") + 1])
    code = main(argv)
    out = capsys.readouterr()
    assert code == 0, f"{page}: {command}\n{out.err}"
    assert len(started) == 1 and started[0].algo == argv[1], out.err


def random_dataset(env_id: str, dataset_id: str) -> None:
    """A small Minari dataset of uniformly random play in ``env_id``, in ``MINARI_DATASETS_PATH``."""
    from distrl.data.minari_store import write_dataset
    from distrl.data.recorder import record_episodes
    from distrl.envs.names import resolve_env_id
    from distrl.envs.vector import make_env

    env = make_env(resolve_env_id(env_id), 1)
    try:
        episodes = record_episodes(env, None, 300, seed=0, random=True)
        write_dataset(dataset_id, episodes, env.env_id, env.single_observation_space, env.single_action_space, "test")
    finally:
        env.close()


RUN_COMMANDS = [
    (page, c)
    for page, c in ALL
    if argv_of(c)[0] in ("eval", "export", "collect", "plot") and not any(mark in c for mark in READERS_OWN)
]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """A CartPole run that stands in for the docs' ``RUN``, ``runs/a`` and ``runs/ppo-...`` paths."""
    run = tmp_path_factory.mktemp("docs") / "run"
    args = ["train", "ppo", "CartPole-v1", "--total-steps", "1024", "--n-envs", "4", "--n-steps", "64", "--quiet"]
    assert main([*args, "--eval-episodes", "1", "--run-dir", str(run)]) == 0
    return run


def stand_in(argv: list[str], run: Path) -> list[str]:
    """``argv`` with the docs' run paths replaced by ``run`` (a glob of runs by the run itself)."""
    return [str(run) if token == "RUN" or token.startswith("runs/") else token for token in argv]


@pytest.mark.parametrize(("page", "command"), RUN_COMMANDS, ids=[f"{p}:{c[7:60]}" for p, c in RUN_COMMANDS])
def test_every_eval_export_and_plot_command_in_the_docs_runs(page, command, small_run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    argv = stand_in(argv_of(command), small_run)
    if argv[0] == "eval" and "--episodes" not in argv:
        argv += ["--episodes", "2"]  # the shown count does not change what is checked
    if argv[0] == "collect":  # as few steps as give an episode, in a datasets directory of this test's own
        monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
        argv = [*argv, "--steps", "200"]
    code = main(argv)
    out = capsys.readouterr()
    assert code == 0, f"{page}: {command}\n{out.err}"
    written = [token for token in argv if Path(token).suffix in (".gif", ".mp4", ".png", ".pt", ".onnx")]
    for name in written:
        assert (tmp_path / name).stat().st_size > 0, name


def test_the_docs_run_commands_cover_eval_export_collect_and_plot():
    assert {argv_of(c)[0] for _, c in RUN_COMMANDS} == {"eval", "export", "collect", "plot"}
