"""benchmarks/results.py: which preset a run used; runs whose timing does not compare stay out of wall time and SPS."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

import results  # noqa: E402


def run(name, seed, wall_s, sps, last100, caveat="", env_kwargs=()):
    return {
        "dir": Path(name),
        "seed": seed,
        "last100": last100,
        "timing_caveat": caveat,
        "settings": "HalfCheetah-v5",
        "config": {"strategy": {}, "run": {"env_kwargs": list(env_kwargs)}},
        "summary": {
            "algo": "sac",
            "env": "HalfCheetah-v5",
            "strategy": "single",
            "workers": 1,
            "total_steps": 1000,
            "wall_s": wall_s,
            "sps": sps,
            "final_eval_mean_return": last100 + 10,
        },
    }


def test_a_run_marked_as_not_comparable_is_left_out_of_wall_time_and_sps_but_not_returns():
    lines = results.learning_table(
        [
            run("sac-a-s0", 0, 600.0, 100.0, 1000.0),
            run("sac-a-s1", 1, 6000.0, 10.0, 3000.0, caveat="paused for 2 hours"),
        ]
    )
    row = lines[2].split(" | ")
    assert row[4] == "0, 1" and row[6] == "2,000 ± 1,414"  # both seeds' returns
    assert row[8] == "10.0" and row[9] == "100"  # wall minutes and SPS of seed 0 alone
    assert lines[-1].endswith("sac-a-s1: paused for 2 hours.")


def test_a_group_with_no_comparable_timing_says_so():
    lines = results.learning_table([run("sac-b-s0", 0, 600.0, 100.0, 1000.0, caveat="resumed in another session")])
    row = lines[2].split(" | ")
    assert row[8] == "n/c" and row[9] == "n/c"
    assert "sac-b-s0: resumed in another session" in lines[-1]


def test_runs_that_gave_the_env_arguments_get_their_own_row_which_names_them():
    lines = results.learning_table(
        [
            run("sac-c-s0", 0, 600.0, 100.0, 1000.0),
            run("sac-c-s1", 1, 600.0, 100.0, 3000.0),
            run("sac-d-s0", 0, 600.0, 100.0, 5000.0, env_kwargs=["reset_noise_scale=0.2"]),
        ]
    )
    rows = [line.split(" | ") for line in lines[2:]]
    assert [(r[0].strip("| "), r[4], r[6]) for r in rows] == [
        ("HalfCheetah-v5", "0, 1", "2,000 ± 1,414"),
        ("HalfCheetah-v5 (reset_noise_scale=0.2)", "0", "5,000"),
    ]
    assert rows[1][-1].startswith("RL Zoo 9535")  # the env's published figures still apply


def test_a_run_that_saved_or_compacted_its_replay_buffer_still_used_its_preset():
    from distrl.config import SACConfig, to_dict
    from distrl.training.presets import PRESETS

    params = {k: v for k, v in PRESETS["sac"]["Hopper-v5"].items() if k != "total_steps"}
    stored = dict(to_dict(SACConfig(**params)), save_replay=True, optimize_memory_usage=True)
    sac_run = {"summary": {"algo": "sac", "env": "Hopper-v5"}, "config": {"sac": stored}}
    assert results.settings(sac_run) == "Hopper-v5"
    assert results.settings({**sac_run, "config": {"sac": dict(stored, tau=0.02)}}) == "custom"


def test_settings_shared_by_several_presets_are_named_after_the_runs_env():
    from distrl.config import PPOConfig, to_dict
    from distrl.training.presets import PRESETS

    def ppo_run(env, preset):
        params = {k: v for k, v in PRESETS["ppo"][preset].items() if k != "total_steps"}
        return {"summary": {"algo": "ppo", "env": env}, "config": {"ppo": to_dict(PPOConfig(**params))}}

    # ant-cleanrl holds the Hopper-v5 preset's values, ant-tianshou those of halfcheetah-tianshou
    assert PRESETS["ppo"]["ant-cleanrl"] == PRESETS["ppo"]["Hopper-v5"]
    assert PRESETS["ppo"]["ant-tianshou"] == PRESETS["ppo"]["halfcheetah-tianshou"]
    assert results.settings(ppo_run("Ant-v5", "ant-cleanrl")) == "ant-cleanrl"
    assert results.settings(ppo_run("Hopper-v5", "ant-cleanrl")) == "Hopper-v5"
    assert results.settings(ppo_run("HalfCheetah-v5", "ant-tianshou")) == "halfcheetah-tianshou"


def test_the_results_page_is_what_the_kept_runs_regenerate():
    # docs/results.md is generated: a hand edit, or a kept run whose page was not rewritten, shows up here
    assert results.PAGE.read_text() == results.page_text(draw=False), (
        "docs/results.md differs from what `python benchmarks/results.py` writes: run it and commit the page"
    )


def test_ppo_on_a_multiagent_env_is_ippo_or_mappo_by_its_critic_and_counts_agent_steps(tmp_path):
    def spread(name, critic, seed):
        base = run(name, seed, 60.0, 100.0, -50.0)
        base["summary"] = {**base["summary"], "algo": "ppo", "env": results.SPREAD, "total_steps": 600}
        base["config"]["run"]["critic"] = critic
        base["multiagent"] = True
        base["dir"] = tmp_path / name
        base["dir"].mkdir()
        # 2 agents, 4 games of 50 game steps (100 agent-steps each): team returns -40, -30, -20, -10
        lines = ['#{"t_start": 0}', "r,l,t,r_a,r_b"] + [f"{r},50,1.0,{r / 2},{r / 2}" for r in (-40, -30, -20, -10)]
        (base["dir"] / "monitor.csv").write_text("\n".join(lines) + "\n")
        return base

    ippo, mappo = spread("ippo-s0", "local", 0), spread("mappo-s0", "centralised", 0)
    assert results.algo_label(ippo) == "IPPO" and results.algo_label(mappo) == "MAPPO"
    assert results.algo_label(run("sac", 0, 1.0, 1.0, 1.0)) == "SAC"
    assert results.spread_at(ippo, 250) == -35.0 and results.spread_at(ippo, 400) == -25.0  # games ended by then
    assert results.spread_at(ippo, 700) is None  # past the run's steps
    rows = [line.split(" | ") for line in results.learning_table([ippo, mappo])[2:]]
    assert sorted(row[1] for row in rows) == ["IPPO", "MAPPO"]  # a row each, though both are "custom" settings


def test_distrl_runs_in_bf16_get_a_column_of_their_own_in_the_offline_table():
    import offline_learning

    def record(lib, seed, final, precision=None):
        r = {"lib": lib, "algo": "td3bc", "seed": seed, "curve": [[0, 0.0], [100, final]]}
        r.update(env="Hopper-v5", dataset="hopper/medium-v0", eval_episodes=10)
        return {**r, "precision": precision} if precision else r

    reference = 3234.3 + 20.272305  # a return of x * reference - 20.27 normalises to 100 x
    runs = [
        record("distrl", 0, 0.3 * reference - 20.272305),
        record("distrl", 0, 0.5 * reference - 20.272305, precision="bf16"),
        record("distrl", 1, 0.7 * reference - 20.272305, precision="bf16"),
        record("d3rlpy", 0, 0.2 * reference - 20.272305),
    ]
    paper = " | paper, on D4RL's -v2 (another dataset) |"
    header, _, row = offline_learning.summary_lines(runs)[2:5]
    assert header == "| algorithm | distrl | distrl bf16 | d3rlpy | seeds" + paper
    cells = row.split(" | ")
    assert cells[1:4] == ["30.0", "60.0 ± 14.1 (50.0 / 70.0)", "20.0"]
    assert cells[4] == "distrl 0; distrl bf16 0, 1; d3rlpy 0"
    # without bf16 records the table is the two libraries' alone, as before
    assert offline_learning.summary_lines([runs[0], runs[3]])[2] == "| algorithm | distrl | d3rlpy | seeds" + paper


def test_the_offline_table_shows_what_the_papers_report_on_d4rls_dataset_of_the_same_kind():
    import offline_learning

    def lines(env, dataset):
        run = {"lib": "distrl", "algo": "td3bc", "seed": 0, "curve": [[0, 0.0], [100, 500.0]], "eval_episodes": 10}
        return offline_learning.summary_lines([{**run, "env": env, "dataset": dataset}])

    replay, medium = lines("Hopper-v5", "hopper/medium-replay-v1"), lines("Hopper-v5", "hopper/medium-v1")
    assert replay[4].endswith("| 0 | 60.9 |") and medium[4].endswith("| 0 | 59.3 |")  # TD3+BC's, in its paper
    assert replay[2].endswith("paper, on D4RL's -v2 (another dataset) |")
    # the mean over the last evaluations is not what a paper reports: that table has no such column
    assert replay[-1].endswith("| 0 |")
    # a dataset of a kind the papers do not report on, or of another env, has no such column
    for env, dataset in [("Hopper-v5", "hopper/expert-v0"), ("LunarLander-v3", "lunarlander/medium-v0")]:
        assert lines(env, dataset)[2] == "| algorithm | distrl | seeds |"


def test_the_offline_table_beside_the_finals_averages_each_runs_last_five_evaluations():
    import offline_learning

    reference = 3234.3 + 20.272305

    def record(seed, normalised_returns):
        curve = [[100 * i, x / 100 * reference - 20.272305] for i, x in enumerate(normalised_returns)]
        return {"lib": "distrl", "algo": "bc", "seed": seed, "curve": curve, "env": "Hopper-v5", "dataset": "d"}

    runs = [record(0, [0, 90, 10, 50, 10, 50, 10]), record(1, [0, 0, 30, 30, 30, 30, 30])]
    lines = offline_learning.summary_lines([{**r, "eval_episodes": 10} for r in runs])
    finals, last = lines[4], lines[-1]
    assert finals.split(" | ")[1] == "20.0 ± 14.1 (10.0 / 30.0)"
    assert lines[6] == "Each run's mean over its last 5 evaluations (200 to 600 steps):"
    assert last.split(" | ")[1] == "28.0 ± 2.8 (26.0 / 30.0)"  # (10 + 50 + 10 + 50 + 10) / 5 = 26


def test_offline_runs_go_only_into_the_results_of_the_dataset_they_were_made_on(tmp_path, monkeypatch, capsys):
    """The same command makes another dataset on another kind of CPU (DATASETS.md): offline_learning.py tells the
    two apart by transitions, episodes and mean return, and refuses to add runs of one to the other's file."""
    import argparse
    import json

    import gymnasium as gym
    import numpy as np
    import pytest

    import offline_learning
    from distrl.data.minari_store import write_dataset

    def episode(length, reward):
        return {
            "observations": np.zeros((length + 1, 2), np.float32),
            "actions": np.zeros((length, 1), np.float32),
            "rewards": np.full(length, reward),
            "terminations": np.arange(length) == length - 1,
            "truncations": np.zeros(length, bool),
        }

    spaces = gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32)
    for version, episodes in [(0, [episode(3, 1.0), episode(5, 0.5)]), (1, [episode(3, 1.0), episode(5, 0.25)])]:
        write_dataset(f"toy/medium-v{version}", episodes, "ToyEnv-v0", *spaces, "test", str(tmp_path / "data"))
    # 8 transitions in 2 episodes, returns 3 and 2.5 (v0) and 3 and 1.25 (v1)
    v0 = offline_learning.dataset_fingerprint(str(tmp_path / "data"), "toy/medium-v0")
    assert v0 == {"transitions": 8, "episodes": 2, "mean_return": 2.75}
    v1 = offline_learning.dataset_fingerprint(str(tmp_path / "data"), "toy/medium-v1")
    assert v1 == {"transitions": 8, "episodes": 2, "mean_return": 2.12}  # 2.125, rounded to two decimals

    results = tmp_path / "toy_medium-v0.json"
    assert offline_learning.check_dataset(results, v0) is None  # no file yet
    results.write_text(json.dumps({"dataset": {**v0, "mean_return": 2.759}, "runs": []}))
    assert offline_learning.check_dataset(results, v0) is None  # the last decimal as another sum rounds it
    results.write_text(json.dumps({"dataset": v0, "runs": []}))
    said = offline_learning.check_dataset(results, v1)
    assert said.startswith("dataset: this one has 8 transitions, 2 episodes, mean return 2.12; the runs in ")
    assert "toy_medium-v0.json were made on one with 8 transitions, 2 episodes, mean return 2.75" in said

    monkeypatch.setattr(offline_learning, "RESULTS", tmp_path)
    args = argparse.Namespace(dataset="toy/medium-v1", datasets_dir=str(tmp_path / "data"))
    results.rename(tmp_path / "toy_medium-v1.json")  # v0's runs where v1's would go: nothing runs
    with pytest.raises(SystemExit) as stopped:
        offline_learning.run_all(args)
    assert stopped.value.code == 2
    assert capsys.readouterr().err.startswith("error: dataset: this one has 8 transitions")
    args.dataset = "toy/medium-v2"  # not on this machine
    with pytest.raises(SystemExit) as stopped:
        offline_learning.run_all(args)
    assert stopped.value.code == 2
    assert capsys.readouterr().err.startswith("error: dataset='toy/medium-v2' is not in ")
