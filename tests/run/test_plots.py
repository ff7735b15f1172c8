import json
import subprocess
import sys

import numpy as np
import pytest

from distrl.cli import main
from distrl.run.plots import mean_curves, reward_curves, seed_groups, smooth, speedup


def write_monitor(path, returns, lengths, env_id="CartPole-v1"):
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["#" + json.dumps({"t_start": 1700000000.0, "env_id": env_id}), "r,l,t"]
    lines += [f"{r},{l},{0.1 * (i + 1):.6f}" for i, (r, l) in enumerate(zip(returns, lengths))]
    path.write_text("\n".join(lines) + "\n")


def test_two_runs_give_two_curves_in_a_png_of_the_expected_size(tmp_path):
    write_monitor(tmp_path / "a" / "monitor.csv", [10, 20, 30], [10, 20, 30])
    write_monitor(tmp_path / "b" / "monitor.csv", [5, 50], [5, 50])
    out = tmp_path / "curves.png"
    fig = reward_curves([tmp_path / "a", tmp_path / "b"], "total-steps", out=out)
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["a", "b"]
    np.testing.assert_array_equal(lines[0].get_xdata(), [10, 30, 60])  # cumulative episode lengths
    np.testing.assert_array_equal(lines[1].get_ydata(), [5, 50])
    assert fig.axes[0].get_xlabel() == "environment steps (all processes)"
    import imageio.v2 as imageio

    assert imageio.imread(out).shape[:2] == (450, 700)


def test_steps_axis_divides_by_the_collecting_workers(tmp_path):
    run = tmp_path / "ddp"
    write_monitor(run / "monitor.csv", [1, 2], [100, 100])
    (run / "config.json").write_text(json.dumps({"strategy": {"strategy": "ddp", "workers": 2}}))
    fig = reward_curves([run], "steps")
    np.testing.assert_array_equal(fig.axes[0].get_lines()[0].get_xdata(), [50, 100])


def test_a_multiagent_games_steps_count_every_agents_step_as_the_run_counts_them(tmp_path):
    path = tmp_path / "ma" / "monitor.csv"
    path.parent.mkdir()
    header = "#" + json.dumps({"t_start": 1700000000.0, "env_id": "distrl_macoop:unlike"})
    path.write_text("\n".join([header, "r,l,t,r_agent_0,r_agent_1", "4,8,0.1,2,2", "6,8,0.2,3,3"]) + "\n")
    fig = reward_curves([tmp_path / "ma"], "total-steps")
    np.testing.assert_array_equal(fig.axes[0].get_lines()[0].get_xdata(), [16, 32])  # 8 game steps of 2 agents


def test_seeds_of_one_setting_are_one_curve_their_mean_and_band_read_between_episode_ends(tmp_path):
    write_monitor(tmp_path / "a" / "monitor.csv", [0, 10], [10, 10])  # episodes end at steps 10 and 20
    write_monitor(tmp_path / "b" / "monitor.csv", [20, 30], [5, 15])  # at 5 and 20
    write_monitor(tmp_path / "c" / "monitor.csv", [7], [40])
    fig = mean_curves({"ab": [tmp_path / "a", tmp_path / "b"], "c": [tmp_path / "c"]}, "total-steps", points=3)
    ab, c = fig.axes[0].get_lines()
    assert [ab.get_label(), c.get_label()] == ["ab (2 runs)", "c"]
    np.testing.assert_array_equal(ab.get_xdata(), [0, 10, 20])  # up to where the shorter run ends
    # a at 0, 10, 20: 0, 0, 10 (held before its first episode end); b: 20, 20 + 5/15 * 10, 30
    np.testing.assert_allclose(ab.get_ydata(), [10, (0 + 20 + 10 / 3) / 2, 20])
    band = fig.axes[0].collections  # one band, for the group of two
    assert len(band) == 1
    lows_highs = band[0].get_paths()[0].vertices[:, 1]
    assert lows_highs.min() == pytest.approx(0) and lows_highs.max() == pytest.approx(30)


def test_runs_that_differ_only_in_their_seed_are_grouped_and_named_by_what_their_names_share(tmp_path):
    def run(name, seed, lr):
        write_monitor(tmp_path / name / "monitor.csv", [1], [1])
        (tmp_path / name / "config.json").write_text(
            json.dumps(
                {"run": {"seed": seed, "run_dir": str(tmp_path / name), "env": "CartPole-v1"}, "ppo": {"lr": lr}}
            )
        )
        return tmp_path / name

    runs = [run("ppo-x-s0", 0, 1e-3), run("ppo-x-s1", 1, 1e-3), run("ppo-y-s0", 0, 3e-4)]
    write_monitor(tmp_path / "sb3run" / "monitor.csv", [1], [1])
    groups = seed_groups([*runs, tmp_path / "sb3run"])
    assert groups == {"ppo-x": runs[:2], "ppo-y-s0": runs[2:], "sb3run": [tmp_path / "sb3run"]}
    out = tmp_path / "together.png"
    assert main(["plot", *map(str, runs), "--seeds", "together", "--out", str(out)]) == 0
    assert out.stat().st_size > 0


def _finished_run(path, returns, lengths, total_steps, strategy=None):
    write_monitor(path / "monitor.csv", returns, lengths)
    (path / "summary.json").write_text(json.dumps({"total_steps": total_steps}))
    if strategy is not None:
        (path / "config.json").write_text(json.dumps({"strategy": strategy}))
    return path


def test_a_curve_goes_on_dotted_to_its_runs_last_step_and_the_legend_says_why(tmp_path):
    done = _finished_run(tmp_path / "done", [10, 30], [20, 40], total_steps=100)  # episodes end at 20 and 60
    write_monitor(tmp_path / "running" / "monitor.csv", [5], [50])  # no summary.json: its end is unknown
    fig = reward_curves([done, tmp_path / "running"], "total-steps", out=tmp_path / "c.png")
    ax = fig.axes[0]
    done_line, dotted, running = ax.get_lines()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["done", "running"]
    assert dotted.get_color() == done_line.get_color() and dotted.get_linestyle() == ":"
    np.testing.assert_array_equal(np.c_[dotted.get_data()], [[60, 30], [100, 30]])  # last return, held to 100
    assert "no episode finished after" in ax.get_legend().get_title().get_text()
    assert ax.get_ylabel() == "return of finished episodes"


def test_the_dotted_end_counts_per_process_steps_and_is_left_out_where_the_curve_reaches_the_end(tmp_path):
    ddp = _finished_run(tmp_path / "ddp", [1, 2], [100, 100], 300, {"strategy": "ddp", "workers": 2})
    _, dotted = reward_curves([ddp], "steps").axes[0].get_lines()
    np.testing.assert_array_equal(np.c_[dotted.get_data()], [[100, 2], [150, 2]])
    exact = _finished_run(tmp_path / "exact", [1, 2], [100, 100], 200)
    ax = reward_curves([exact], "total-steps").axes[0]
    assert len(ax.get_lines()) == 1 and ax.get_legend().get_title().get_text() == ""
    assert len(reward_curves([ddp], "time").axes[0].get_lines()) == 1  # Monitor times and wall_s differ on resume


def test_the_mean_of_seeds_goes_on_dotted_to_the_shortest_runs_last_step(tmp_path):
    a = _finished_run(tmp_path / "a", [0, 10], [10, 10], total_steps=50)  # last episode ends at 20
    b = _finished_run(tmp_path / "b", [20, 30], [5, 15], total_steps=40)
    fig = mean_curves({"ab": [a, b]}, "total-steps", points=3)
    ax = fig.axes[0]
    mean, dotted = ax.get_lines()
    np.testing.assert_array_equal(mean.get_xdata()[[0, -1]], [0, 20])  # the mean up to the last finished episode
    np.testing.assert_allclose(np.c_[dotted.get_data()], [[20, 20], [40, 20]])  # (10 + 30) / 2, held to b's end


def _logged_run(path, strategy, episodes_of_ranks, total_steps):
    """A run directory as a run of ``strategy`` writes it: config.json, monitor.csv (with the ranks' own files
    where several ranks collect) and summary.json; ``episodes_of_ranks``: each rank's (return, length)s."""
    from distrl.config import RunConfig, StrategyConfig
    from distrl.config.base import to_dict
    from distrl.run.logs import RunLogger

    config = {"run": to_dict(RunConfig(total_steps=total_steps)), "strategy": to_dict(StrategyConfig(**strategy))}
    logger = RunLogger.start(path, "CartPole-v1", config, (), "distrl")
    ranks = len(episodes_of_ranks)
    for rank, episodes in enumerate(episodes_of_ranks):  # as the main worker logs what it gathered
        logger.episodes([r for r, _ in episodes], [n for _, n in episodes], total_steps, rank if ranks > 1 else None)
    logger.summary({"total_steps": total_steps})
    logger.close()
    return path


def test_by_default_a_single_run_and_a_two_rank_ddp_run_of_one_budget_end_at_the_same_step(tmp_path, monkeypatch):
    single = _logged_run(tmp_path / "single", {"strategy": "single"}, [[(1, 120), (2, 130), (3, 100)]], 400)
    # two ranks of 200 steps each: 170 and 160 of them in finished episodes
    ddp = _logged_run(
        tmp_path / "ddp", {"strategy": "ddp", "workers": 2}, [[(1, 90), (2, 80)], [(3, 60), (4, 100)]], 400
    )
    assert (ddp / "ranks" / "rank-1.monitor.csv").is_file()
    from distrl.run import plots

    drawn = []
    monkeypatch.setattr(plots, "reward_curves", lambda *a, **k: drawn.append(reward_curves(*a, **k)))
    assert main(["plot", str(single), str(ddp), "--out", str(tmp_path / "c.png")]) == 0  # no --x
    ax = drawn[0].axes[0]
    single_line, single_end, ddp_line, ddp_end = ax.get_lines()
    np.testing.assert_array_equal(single_line.get_xdata(), [120, 250, 350])
    np.testing.assert_array_equal(ddp_line.get_xdata(), [90, 170, 230, 330])  # every rank's episodes, in turn
    assert single_end.get_xdata()[-1] == ddp_end.get_xdata()[-1] == 400  # both at their --total-steps
    assert ax.get_xlabel() == "environment steps (all processes)"
    per_process = reward_curves([single, ddp], "steps").axes[0].get_lines()  # still there when asked for
    assert per_process[1].get_xdata()[-1] == 400 and per_process[3].get_xdata()[-1] == 200


def test_smoothing_and_speedup_by_hand():
    np.testing.assert_allclose(smooth(np.array([0.0, 2.0, 4.0, 6.0]), 2), [0.0, 1.0, 3.0, 5.0])
    assert speedup(t1=10.0, steps1=1000, tn=6.0, steps_n=1200) == pytest.approx(2.0)  # 10/6 * 1200/1000


def test_stable_baselines3_monitor_files_are_read(tmp_path):
    sb3 = pytest.importorskip("stable_baselines3")
    import gymnasium as gym
    from stable_baselines3.common.monitor import Monitor

    env = Monitor(gym.make("CartPole-v1"), str(tmp_path / "sb3run" / "0"))
    env.reset(seed=0)
    for _ in range(3):
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(0)
            done = terminated or truncated
        env.reset()
    env.close()
    assert sb3 is not None
    fig = reward_curves([tmp_path / "sb3run"], "time")
    assert len(fig.axes[0].get_lines()[0].get_ydata()) == 3


@pytest.mark.parametrize(
    "args, message",
    [
        (["plot", "/no/such/run"], "does not exist"),
        (["plot", "EMPTY", "--x", "steps"], "holds no episodes"),
        (["plot", "EMPTY", "--smooth", "0"], "smooth=0 is not allowed"),
    ],
)
def test_bad_plot_inputs_are_one_line_exit_2(tmp_path, capsys, args, message):
    write_monitor(tmp_path / "empty" / "monitor.csv", [], [])
    args = [str(tmp_path / "empty") if a == "EMPTY" else a for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_unknown_axis_is_rejected(tmp_path):
    write_monitor(tmp_path / "a" / "monitor.csv", [1], [1])
    result = subprocess.run(
        [sys.executable, "-m", "distrl", "plot", str(tmp_path / "a"), "--x", "episodes"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "episodes" in result.stderr


def test_recording_writes_the_expected_number_of_frames(tmp_path):
    import imageio.v2 as imageio

    from distrl.envs.video import record

    left = lambda obs: 0  # noqa: E731 - pushing left topples CartPole within a few steps
    env_steps = []
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    env.reset(seed=3)
    done, n = False, 0
    while not done:
        _, _, terminated, truncated, _ = env.step(0)
        n += 1
        done = terminated or truncated
    env_steps.append(n)
    recording = record("CartPole-v1", [left, left], tmp_path / "v.mp4", episodes=1, seed=3)
    assert recording.frames == env_steps[0] + 1  # the reset frame and one per step
    assert recording.returns == [[float(env_steps[0])], [float(env_steps[0])]]  # CartPole: 1 per step
    video = imageio.mimread(tmp_path / "v.mp4", memtest=False)
    assert len(video) == recording.frames and video[0].shape[1] == 2 * 600  # two columns side by side


def test_labelled_panes_carry_a_strip_naming_each_policy_and_its_return(tmp_path):
    import imageio.v2 as imageio

    from distrl.envs.video import LABEL_HEIGHT, record

    recording = record(
        "CartPole-v1", [lambda obs: 0, lambda obs: 1], tmp_path / "v.gif", seed=3, labels=["untrained", "trained"]
    )
    video = imageio.mimread(tmp_path / "v.gif")
    height = video[0].shape[0]
    assert height == 400 + LABEL_HEIGHT  # CartPole renders 600x400: a strip above each pane
    strip, scene = video[0][:LABEL_HEIGHT], video[0][LABEL_HEIGHT:]
    for pane in (strip[:, :600], strip[:, 600:]):
        assert (pane[..., :3] > 200).any() and (pane[..., :3] < 40).mean() > 0.8  # light text on a dark strip
    assert not np.array_equal(strip[:, :600], strip[:, 600:])  # the two labels differ
    assert (scene[..., :3] > 200).mean() > 0.5  # the scene itself is untouched (CartPole's white background)
    assert all(len(r) == 1 for r in recording.returns)


def test_record_needs_a_gif_or_mp4_name(tmp_path, capsys):
    from distrl.config import ConfigError
    from distrl.envs.video import record

    with pytest.raises(ConfigError, match="must end in .gif or .mp4"):
        record("CartPole-v1", [lambda obs: 0], tmp_path / "v.avi")


@pytest.mark.slow  # the bench tool; every strategy it times runs in the default suite
@pytest.mark.multiprocess
def test_bench_scaling_writes_figures_and_chart(tmp_path):
    out = tmp_path / "bench"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "distrl",
            "bench",
            "scaling",
            "ppo",
            "CartPole-v1",
            "--workers",
            "1,2",
            "--total-steps",
            "2048",
            "--out-dir",
            str(out),
            "--extra=--n-envs 4 --n-steps 32 --batch-size 64 --n-epochs 2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads((out / "scaling.json").read_text())
    base, two = figures["runs"]
    assert base["strategy"] == "single" and two["strategy"] == "ddp" and base["speedup"] == 1.0
    assert two["speedup"] == pytest.approx(base["train_s"] / two["train_s"] * two["total_steps"] / base["total_steps"])
    assert (out / "speedup.png").stat().st_size > 1000
    assert "[2/2] ddp x2" in result.stderr
