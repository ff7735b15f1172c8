"""Offline training (BC, TD3+BC, IQL) from Minari datasets recorded here: learning, ddp against one process,
resume against not stopping, the command line's collect and refusals."""

import json
import os

import numpy as np
import pytest
import torch

from distributed import run_ranks
from distrl.cli import main
from distrl.config import BCConfig, ConfigError, CQLConfig, IQLConfig, RunConfig, TD3BCConfig, TD3Config
from distrl.data.minari_store import write_dataset
from distrl.data.recorder import record_episodes
from distrl.envs.vector import make_env
from distrl.training import OfflineTrainer

pytest.importorskip("minari")

REACH = "distrl_testenvs:Reach"
SMALL = dict(net_arch=(64, 64), batch_size=128)


def cartpole_expert(obs, starts):
    """A hand-written CartPole controller that balances to the 500-step limit: push towards where the pole falls."""
    return (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)


def mountain_car_expert(obs, starts):
    """Full throttle in the direction of motion: reaches the flag in about 110 steps (return about 90)."""
    return np.where(obs[:, 1:2] >= 0, 1.0, -1.0).astype(np.float32)


def full_speed(obs, starts):
    """Reach's expert: full speed towards the goal."""
    return np.ones((len(obs), 1), np.float32)


def record(env_id, dataset_id, act, steps, root, random=False, epsilon=0.0):
    env = make_env(env_id, 4)
    try:
        episodes = record_episodes(env, act, steps, seed=0, epsilon=epsilon, random=random)
        write_dataset(
            dataset_id, episodes, env_id, env.single_observation_space, env.single_action_space, "test", str(root)
        )
    finally:
        env.close()
    return episodes


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("datasets")
    record("CartPole-v1", "cartpole/expert-v0", cartpole_expert, 3000, root)
    record("MountainCarContinuous-v0", "mcc/mixed-v0", mountain_car_expert, 2000, root, epsilon=0.5)
    # mostly random play, which almost never reaches the goal, and a few episodes at full speed right
    random = record(REACH, "reach/random-v0", None, 6000, root, random=True)
    expert = record(REACH, "reach/few-v0", full_speed, 40, root)
    record(REACH, "reach/expert-v0", lambda obs, starts: 0.8 * full_speed(obs, starts), 1000, root, epsilon=0.2)
    env = make_env(REACH, 1)
    write_dataset(
        "reach/mixed-v0",
        random + expert,
        REACH,
        env.single_observation_space,
        env.single_action_space,
        "test",
        str(root),
    )
    env.close()
    return root


def trainer(algo, env, cfg, root, steps, **run):
    run_cfg = RunConfig(algo=algo, env=env, total_steps=steps, seed=0, quiet=True, **run)
    return OfflineTrainer(run_cfg, cfg.__class__(**{**cfg.__dict__, "datasets_dir": str(root)}))


def test_bc_clones_a_cartpole_expert_to_its_return(datasets):
    t = trainer("bc", "CartPole-v1", BCConfig(dataset="cartpole/expert-v0", **SMALL), datasets, 2000)
    t.train()
    mean, _ = t.evaluate_now()
    t.close()
    assert mean >= 475  # solved; the expert scores 500


@pytest.mark.parametrize(
    "algo, cfg, extra",
    [
        ("bc", BCConfig, {}),
        ("td3bc", TD3BCConfig, {}),
        ("iql", IQLConfig, {}),
        ("cql", CQLConfig, {"n_action_samples": 2}),
    ],
)
def test_each_algorithm_reaches_the_experts_return_on_a_continuous_task(datasets, algo, cfg, extra):
    # CQL's steps are the dearest: it returned 8.6, 8.7 and 8.8 after 250, 350 and 500 (a Xeon, 2026-11-30)
    steps = 500 if algo == "cql" else 1000
    t = trainer(algo, REACH, cfg(dataset="reach/expert-v0", **SMALL, **extra), datasets, steps)
    t.train()
    mean, _ = t.evaluate_now()
    t.close()
    assert mean > 8  # the expert (0.8 of full speed, 20% random actions) returns about 8.7; one that never arrives -3


def test_discrete_cql_reaches_the_cartpole_experts_return(datasets):
    t = trainer("cql", "CartPole-v1", CQLConfig(dataset="cartpole/expert-v0", net_arch=(64, 64)), datasets, 2000)
    t.train()
    mean, _ = t.evaluate_now()
    t.close()
    assert mean >= 475


def test_iql_learns_from_mostly_random_data_with_a_few_good_episodes_where_cloning_fails(datasets):
    """On the Reach task: uniformly random play (which almost never reaches the goal) and a few episodes at full
    speed. Cloning the mixture averages the actions to about 0; IQL's advantage weights pick the good ones."""
    scores = {}
    for algo, cfg, steps in (("bc", BCConfig, 1000), ("iql", IQLConfig, 4000)):
        t = trainer(algo, REACH, cfg(dataset="reach/mixed-v0", **SMALL), datasets, steps)
        t.train()
        scores[algo], _ = t.evaluate_now()
        t.close()
    assert scores["iql"] > 0  # it reaches the goal (a policy that never does returns -3)
    assert scores["bc"] < 0


def ranks_train(rank, world, root, algo, on_disk=False, precision="fp32"):
    from distrl.strategies.ddp import DistributedSync

    run_cfg = RunConfig(
        algo=algo, env="MountainCarContinuous-v0", total_steps=6, seed=0, quiet=True, precision=precision
    )
    cfg = {"td3bc": TD3BCConfig, "iql": IQLConfig, "cql": CQLConfig}[algo](
        dataset="mcc/mixed-v0", datasets_dir=str(root), dataset_on_disk=on_disk, **SMALL
    )
    t = OfflineTrainer(run_cfg, cfg, sync=DistributedSync(torch.device("cpu"), 30))
    t.train()
    tensors = t.state_tensors()
    t.close()
    return {k: v for k, v in tensors.items() if not k.startswith("algo/gradient_steps")}


@pytest.mark.parametrize("algo, on_disk", [("td3bc", False), ("iql", False), ("cql", False), ("td3bc", True)])
def test_two_ranks_each_on_half_the_episodes_train_as_one_process_does(datasets, algo, on_disk):
    """In memory, and with each rank's shard decoded into files (--dataset-on-disk) against one process in memory;
    TD3+BC standardises observations by statistics summed over the ranks' shards."""
    rank0, rank1 = run_ranks(ranks_train, 2, str(datasets), algo, on_disk)
    run_cfg = RunConfig(algo=algo, env="MountainCarContinuous-v0", total_steps=6, seed=0, quiet=True)
    cfg = {"td3bc": TD3BCConfig, "iql": IQLConfig, "cql": CQLConfig}[algo](
        dataset="mcc/mixed-v0", datasets_dir=str(datasets), **SMALL
    )
    single = OfflineTrainer(run_cfg, cfg)
    single.train()
    expected = single.state_tensors()
    single.close()
    for name, value in rank0.items():
        assert torch.equal(value, rank1[name]), name
        torch.testing.assert_close(value, expected[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.heavy
def test_two_ranks_in_bf16_train_as_one_process_does_within_bfloat16s_rounding(datasets):
    """Under --precision bf16 each rank's weight gradient is its half-batch sum rounded to bfloat16 before the
    all-reduce, where one process rounds the whole batch's once: the two agree to bfloat16's rounding, not exactly."""
    rank0, rank1 = run_ranks(ranks_train, 2, str(datasets), "td3bc", False, "bf16")
    cfg = TD3BCConfig(dataset="mcc/mixed-v0", **SMALL)
    single = trainer("td3bc", "MountainCarContinuous-v0", cfg, datasets, 6, precision="bf16")
    single.train()
    assert single.algo.critic.module.q1.low_precision is torch.bfloat16
    expected = single.state_tensors()
    single.close()
    fresh = trainer("td3bc", "MountainCarContinuous-v0", cfg, datasets, 6)  # where both started from
    initial = fresh.state_tensors()
    fresh.close()
    for name, value in rank0.items():
        assert torch.equal(value, rank1[name]), name
        if value.dtype == torch.float32 and value.numel() > 1 and not name.startswith("obs_norm"):
            # weights, targets and Adam's moments: each moved in 6 steps, and the ranks' were at most 0.35% of that
            # away from one process's when this was written (in float32, under 1e-6 of it)
            moved, apart = (expected[name] - initial[name]).norm(), (value - expected[name]).norm()
            assert moved > 0 and apart < 0.01 * moved, (name, float(apart), float(moved))


def test_a_resumed_run_ends_where_an_unstopped_one_does(datasets, tmp_path):
    from distrl.run import checkpoint

    cfg = TD3BCConfig(dataset="mcc/mixed-v0", datasets_dir=str(datasets), **SMALL)

    def run(name, seed=3):
        run_cfg = RunConfig(
            algo="td3bc", env="MountainCarContinuous-v0", total_steps=9, seed=seed, quiet=True, checkpoint_every=3
        )
        return OfflineTrainer(run_cfg, cfg, run_dir=tmp_path / name)

    whole = run("whole")
    whole.train()
    first = run("cut")
    first.train(stop_at=3)  # at its first checkpoint, between two actor steps (policy_freq 2)
    first.close()
    resumed = run("cut")
    resumed.load_checkpoint(checkpoint.find_latest(tmp_path / "cut"))
    resumed.train()
    other = run("other", seed=4)
    other.train()
    ends = [t.state_tensors() for t in (whole, resumed, other)]
    for name, value in ends[0].items():
        assert torch.equal(ends[1][name], value), name
    assert not torch.equal(ends[2]["algo/actor/net.0.weight"], ends[0]["algo/actor/net.0.weight"])  # it can fail
    for t in (whole, resumed, other):
        t.close()


def test_collect_writes_a_dataset_that_trains_bc_from_the_command_line(datasets, tmp_path, capsys):
    run_dir = tmp_path / "bc"
    flags = ["--datasets-dir", str(datasets), "--total-steps", "300", "--net-arch", "32", "32", "--quiet"]
    assert (
        main(["train", "bc", "CartPole-v1", "--dataset", "cartpole/expert-v0", *flags, "--run-dir", str(run_dir)]) == 0
    )
    out = ["--out", "cartpole/from-bc-v0", "--datasets-dir", str(datasets), "--steps", "600", "--n-envs", "2"]
    assert main(["collect", str(run_dir), *out, "--epsilon", "0.1", "--seed", "5"]) == 0
    said = capsys.readouterr().out
    assert "cartpole/from-bc-v0: " in said and "written to" in said
    import minari

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINARI_DATASETS_PATH", str(datasets))
        dataset = minari.load_dataset("cartpole/from-bc-v0")
    assert dataset.total_steps >= 600 and dataset.storage.metadata["algorithm_name"] == "distrl bc"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["total_steps"] == 300
    drawn = ["--out", "cartpole/drawn-v0", "--datasets-dir", str(datasets), "--steps", "200", "--stochastic"]
    assert main(["collect", str(run_dir), *drawn]) == 0  # BC's categorical draws its choices
    assert main(["eval", str(run_dir), "--stochastic", "--episodes", "2"]) == 0
    capsys.readouterr()


def test_a_deterministic_offline_policy_refuses_stochastic_acting_from_the_command_line(datasets, tmp_path, capsys):
    run_dir = tmp_path / "td3bc"
    flags = ["--datasets-dir", str(datasets), "--total-steps", "20", "--net-arch", "16", "16", "--quiet"]
    assert main(["train", "td3bc", REACH, "--dataset", "reach/expert-v0", *flags, "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()
    for argv in (["eval", str(run_dir), "--stochastic"], ["export", str(run_dir), "--stochastic"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is not available for td3bc on Box actions: its policy is deterministic" in err[0]
    assert not (run_dir / "export").exists()


@pytest.mark.parametrize(
    "argv, says",
    [
        (["train", "bc", "CartPole-v1"], "dataset='' is not allowed"),
        (["train", "bc", "CartPole-v1", "--dataset", "nowhere/none-v0"], "dataset='nowhere/none-v0'"),
        (["train", "td3bc", "CartPole-v1", "--dataset", "cartpole/expert-v0"], "td3bc needs Box"),
        (["train", "bc", "Pendulum-v1", "--dataset", "cartpole/expert-v0"], "space"),
        (
            ["train", "iql", "MountainCarContinuous-v0", "--dataset", "mcc/expert-v0", "--strategy", "pipeline"],
            "pipeline",
        ),
    ],
)
def test_a_dataset_that_cannot_serve_is_one_line_and_no_run_directory(datasets, tmp_path, capsys, argv, says):
    run_dir = tmp_path / "run"
    assert main([*argv, "--datasets-dir", str(datasets), "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("distrl: error: ") and says in err[0], err
    assert not run_dir.exists()


def test_iql_goes_on_online_from_an_offline_run_and_keeps_the_dataset_on_request(datasets, tmp_path):
    """A short offline IQL run that does not reach the goal yet, then online from its weights: it starts where
    the offline run ended (same weights, same evaluation) and learns to reach the goal from its own play."""
    offline = trainer("iql", REACH, IQLConfig(dataset="reach/mixed-v0", **SMALL), datasets, 1000)
    offline.train()
    before, _ = offline.evaluate_now()
    path = offline.write_checkpoint(tmp_path / "offline")
    weights = offline.state_tensors()["algo/actor/net.0.weight"]
    offline.close()
    assert before < 0  # not there yet
    online = trainer("iql", REACH, IQLConfig(init_from=str(path), **SMALL), datasets, 1000)
    assert torch.equal(online.state_tensors()["algo/actor/net.0.weight"], weights)
    assert online.evaluate_now()[0] == before
    online.train()
    after, _ = online.evaluate_now()
    assert online.steps == 1000 and 0 < online.replay.size <= 1000  # its own transitions (reset steps are none)
    online.close()
    assert after > 0  # it reaches the goal now
    kept = trainer(
        "iql", REACH, IQLConfig(dataset="reach/mixed-v0", init_from=str(path), keep_dataset=True, **SMALL), datasets, 10
    )
    kept.train()
    assert kept.replay.size > kept._load_data().size  # the dataset's transitions, then its own
    kept.close()


def test_td3_learns_online_from_scratch(datasets):
    t = trainer("td3", REACH, TD3Config(learning_starts=300, **SMALL), datasets, 2000)
    t.train()
    mean, _ = t.evaluate_now()
    t.close()
    assert mean > 0  # it reaches the goal; uniformly random play returns about -3


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ["train", "td3", REACH, "--init-from", "IQL_RUN"],
            "holds a run of iql; td3 goes on from a run of td3bc or td3",
        ),
        (["train", "iql", REACH, "--dataset", "reach/mixed-v0", "--keep-dataset"], "keep_dataset=True is not allowed"),
        (["train", "td3", REACH, "--strategy", "ddp", "--workers", "2"], "it runs in one process"),
        (["train", "cql", "CartPole-v1", "--init-from", "IQL_RUN"], "online fine-tuning needs Box"),
        (["train", "bc", REACH, "--dataset", "reach/mixed-v0", "--init-from", "IQL_RUN"], "not available for bc"),
    ],
)
def test_online_mistakes_are_one_line_and_no_run_directory(datasets, tmp_path, capsys, argv, says):
    iql_run = tmp_path / "iql"
    t = OfflineTrainer(
        RunConfig(algo="iql", env=REACH, total_steps=2, seed=0, quiet=True),
        IQLConfig(dataset="reach/mixed-v0", datasets_dir=str(datasets), **SMALL),
    )
    t.train()
    t.write_checkpoint(iql_run / "model")
    t.close()
    argv = [str(iql_run) if a == "IQL_RUN" else a for a in argv]
    run_dir = tmp_path / "run"
    assert main([*argv, "--datasets-dir", str(datasets), "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("distrl: error: ") and says in err[0], err
    assert not run_dir.exists()


def test_a_collect_stopped_by_sigterm_while_writing_leaves_nothing_in_the_datasets_folder(datasets, tmp_path, capsys):
    import signal

    import minari

    run_dir = tmp_path / "bc"
    flags = ["--datasets-dir", str(datasets), "--total-steps", "50", "--net-arch", "8", "--quiet"]
    assert (
        main(["train", "bc", "CartPole-v1", "--dataset", "cartpole/expert-v0", *flags, "--run-dir", str(run_dir)]) == 0
    )
    capsys.readouterr()
    out = tmp_path / "out"
    written = minari.create_dataset_from_buffers

    def written_then_terminated(*args, **kwargs):  # the episodes are on disk, in the staging folder, when it comes
        dataset = written(*args, **kwargs)
        assert [p.name for p in out.iterdir()][0].startswith(".distrl-writing-")
        os.kill(os.getpid(), signal.SIGTERM)
        return dataset

    def before(signum, frame):  # in place of the default action, which would end the test's process
        raise RuntimeError("collect left SIGTERM to the handler it found")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(minari, "create_dataset_from_buffers", written_then_terminated)
        previous = signal.signal(signal.SIGTERM, before)
        try:
            code = main(
                ["collect", str(run_dir), "--out", "cartpole/stopped-v0", "--datasets-dir", str(out), "--steps", "50"]
            )
            assert signal.getsignal(signal.SIGTERM) is before  # put back
        finally:
            signal.signal(signal.SIGTERM, previous)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 143 and err == ["distrl: SIGTERM received: stopped; no dataset cartpole/stopped-v0 was written"]
    assert list(out.iterdir()) == []  # no staging folder left, no dataset


@pytest.mark.heavy
def test_collect_with_two_workers_writes_both_workers_episodes_reproducibly(datasets, tmp_path):
    import minari

    run_dir = tmp_path / "bc"
    flags = ["--datasets-dir", str(datasets), "--total-steps", "200", "--net-arch", "32", "32", "--quiet"]
    assert (
        main(["train", "bc", "CartPole-v1", "--dataset", "cartpole/expert-v0", *flags, "--run-dir", str(run_dir)]) == 0
    )
    out = ["--datasets-dir", str(datasets), "--steps", "400", "--workers", "2", "--epsilon", "0.5", "--seed", "1"]
    for name in ("cartpole/two-a-v0", "cartpole/two-b-v0"):
        assert main(["collect", str(run_dir), "--out", name, *out]) == 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINARI_DATASETS_PATH", str(datasets))
        a, b = (list(minari.load_dataset(n).iterate_episodes()) for n in ("cartpole/two-a-v0", "cartpole/two-b-v0"))
    assert sum(len(e.actions) for e in a) >= 400
    assert len(a) == len(b) and all(np.array_equal(x.actions, y.actions) for x, y in zip(a, b))  # reproducible
    starts = {tuple(e.observations[0]) for e in a}
    assert len(starts) > 1  # the two workers' streams start from different states


@pytest.mark.parametrize(
    "cls, env, dataset, precision, draws",
    [
        ("TD3BC", REACH, "reach/expert-v0", "fp32", False),
        ("BC", "CartPole-v1", "cartpole/expert-v0", "fp32", True),
        ("CQL", "CartPole-v1", "cartpole/expert-v0", "fp32", False),
        ("CQL", REACH, "reach/expert-v0", "bf16", True),
        ("IQL", REACH, "reach/expert-v0", "fp32", True),
    ],
)
def test_an_offline_policy_exports_to_a_graph_that_acts_as_it_does(
    datasets, tmp_path, cls, env, dataset, precision, draws
):
    """A bf16 run exports its float32 graph: loaded with precision='fp32', the model acts as that graph does. A
    policy that draws (IQL's, CQL's on Box actions, BC's on Discrete actions) exports its draw from a noise input."""
    pytest.importorskip("onnxruntime")
    import distrl

    model = getattr(distrl, cls)(
        env, dataset=dataset, datasets_dir=str(datasets), net_arch=(32, 32), precision=precision
    )
    model.learn(50)
    if precision != "fp32":
        assert model._trainer.algo.critic.module.q1.low_precision is torch.bfloat16  # it trained in bfloat16
        model.save(tmp_path / "model")
        model.close()
        model = getattr(distrl, cls).load(tmp_path / "model", precision="fp32")
    written = model.export(tmp_path / "policy.onnx")  # checked against the model on 256 observations as it is written
    assert written.path.stat().st_size > 0
    if draws:  # checked against deterministic=False acting, with the same noise in both
        sampled = model.export(tmp_path / "sampled.onnx", stochastic=True)
        assert sampled.check.mismatched == 0 and sampled.check.observations == 256
        assert [p["name"] for p in json.loads(sampled.metadata.read_text())["inputs"]] == ["obs", "noise"]
    else:
        with pytest.raises(ConfigError, match=r"stochastic=True is not available for \w+ on \w+ actions: its policy"):
            model.export(tmp_path / "noisy.onnx", stochastic=True)
        with pytest.raises(ConfigError, match="deterministic=False is not available"):
            model.evaluate(1, deterministic=False)
    model.close()


def test_offline_policies_draw_from_their_own_distributions(datasets):
    """4,000 draws at one observation: IQL's Gaussian has the policy's mean and standard deviation (clipped to the
    bounds), CQL's squashed Gaussian's pre-tanh draws those of its network, BC's choices the softmax's frequencies."""
    import distrl

    n = 4000
    iql = distrl.IQL(REACH, dataset="reach/expert-v0", datasets_dir=str(datasets), net_arch=(32, 32)).learn(20)
    actor = iql._trainer.algo.actor.module
    with torch.no_grad():
        actor.log_std.fill_(np.log(0.05))  # narrow enough that clipping to [-1, 1] does not move the moments
    obs = np.zeros((n, 1), np.float32)  # Reach: actions in [-1, 1], the env's bounds too
    mode, _ = iql.predict(obs[:1])
    assert abs(float(mode[0, 0])) < 0.8  # draws within 0.05 x 4 of it are not clipped
    drawn, _ = iql.predict(obs, deterministic=False, rng=np.random.default_rng(0))
    assert drawn.std() == pytest.approx(0.05, rel=0.05)
    assert drawn.mean() == pytest.approx(float(mode[0, 0]), abs=0.005)
    again, _ = iql.predict(obs, deterministic=False, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(drawn, again)  # the caller's generator decides the draws
    iql.close()

    cql = distrl.CQL(REACH, dataset="reach/expert-v0", datasets_dir=str(datasets), net_arch=(32, 32)).learn(20)
    trainer = cql._trainer
    drawn, _ = cql.predict(obs, deterministic=False, rng=np.random.default_rng(1))
    unsquashed = np.arctanh(np.clip(drawn, -0.999999, 0.999999))  # Reach's bounds are [-1, 1]
    with torch.no_grad():
        mean, log_std = trainer.algo.actor.module.net(trainer._normalized(torch.as_tensor(obs[:1])))[0].tolist()
    std = float(np.exp(np.clip(log_std, -20, 2)))
    assert unsquashed.mean() == pytest.approx(mean, abs=0.05 * std)
    assert unsquashed.std() == pytest.approx(std, rel=0.05)
    cql.close()

    bc = distrl.BC("CartPole-v1", dataset="cartpole/expert-v0", datasets_dir=str(datasets), net_arch=(32, 32))
    bc.learn(20)
    cart = np.zeros((n, 4), np.float32)
    cart[:, 2] = 0.01  # the expert pushes right here, but 20 steps leave the policy unsure
    with torch.no_grad():
        probs = torch.softmax(bc._trainer.algo.actor.module(bc._trainer._normalized(torch.as_tensor(cart[:1]))), -1)[0]
    chosen, _ = bc.predict(cart, deterministic=False, rng=np.random.default_rng(2))
    assert 0.05 < float(probs[1]) < 0.95  # both choices likely enough to be seen
    assert np.mean(chosen == 1) == pytest.approx(float(probs[1]), abs=0.03)
    bc.close()


def test_a_resumed_online_run_with_its_replay_ends_where_an_unstopped_one_does(datasets, tmp_path):
    from distrl.run import checkpoint

    def run(name):
        run_cfg = RunConfig(algo="td3", env=REACH, total_steps=240, seed=2, quiet=True, checkpoint_every=120)
        return OfflineTrainer(
            run_cfg, TD3Config(learning_starts=50, save_replay=True, **SMALL), run_dir=tmp_path / name
        )

    whole = run("whole")
    whole.train()
    first = run("cut")
    first.train(stop_at=120)  # at its checkpoint, the replay beside it
    first.close()
    latest = checkpoint.find_latest(tmp_path / "cut")
    assert (latest / "replay.safetensors").exists()
    resumed = run("cut")
    resumed.load_checkpoint(latest)
    assert resumed.replay is not None and 100 < resumed.replay.size <= 120  # its steps, reset steps left out
    resumed.train()
    ends = [t.state_tensors() for t in (whole, resumed)]
    for name, value in ends[0].items():
        assert torch.equal(ends[1][name], value), name
    at_checkpoint = checkpoint.load(latest)[0]["algo/actor/net.0.weight"]
    assert not torch.equal(ends[0]["algo/actor/net.0.weight"], at_checkpoint)  # it trained after the checkpoint
    whole.close()
    resumed.close()


def test_sac_goes_on_from_a_cql_run_acting_and_valuing_as_it_did(datasets, tmp_path):
    """SAC from a CQL run that standardised its observations: SAC's networks see the env's observations as they
    come, with the standardisation taken into their first layers, and act, value and weigh entropy as CQL's did;
    with --keep-dataset its replay starts with the CQL run's dataset, actions in [-1, 1]."""
    from distrl.config import SACConfig
    from distrl.training import OffPolicyTrainer

    offline = trainer("cql", REACH, CQLConfig(dataset="reach/mixed-v0", normalize_obs=True, **SMALL), datasets, 30)
    offline.train()
    path = offline.write_checkpoint(tmp_path / "cql")
    assert offline.obs_std.min() > 0 and not torch.allclose(offline.obs_mean, torch.zeros_like(offline.obs_mean))
    run = RunConfig(algo="sac", env=REACH, total_steps=64, seed=0, quiet=True)
    sac = OffPolicyTrainer(
        run, SACConfig(init_from=str(path), keep_dataset=True, learning_starts=32, net_arch=(64, 64))
    )
    obs = np.random.default_rng(0).normal(size=(16, offline.obs_dim)).astype(np.float32) * 3.0
    np.testing.assert_allclose(sac.act_for_eval(obs, None), offline.act_for_eval(obs, None), atol=1e-5)
    actions = torch.rand(16, 1) * 2 - 1
    normalized = offline._normalized(torch.from_numpy(obs))
    for theirs, ours in ((offline.algo.critic, sac.algo.critic), (offline.algo.critic_target, sac.algo.critic_target)):
        q1, q2 = theirs.module(normalized, actions)
        mine = ours.forward(torch.from_numpy(obs), actions)
        torch.testing.assert_close(mine.q1, q1.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(mine.q2, q2.detach(), atol=1e-5, rtol=1e-5)
    assert sac.algo.alpha == pytest.approx(float(offline.algo.log_alpha.module().detach().exp()), rel=1e-6)
    data = offline._load_data()
    assert sac.replay.size == data.size
    rows = sac.replay.take(np.arange(data.size))
    np.testing.assert_array_equal(rows.obs.numpy(), data.obs)
    torch.testing.assert_close(rows.actions, offline._scaled(torch.from_numpy(data.actions)))
    offline.close()
    before = sac.algo.actor.params.data.clone()
    sac.train()  # 31 steps of CQL's policy alone, then a gradient step after each
    assert data.size + 50 < sac.replay.size <= data.size + 64 and sac.algo.gradient_steps == 33  # reset steps are none
    assert not torch.equal(sac.algo.actor.params.data, before)
    sac.close()


def test_sac_refuses_a_run_it_cannot_go_on_from_in_one_line(datasets, tmp_path, capsys):
    iql = trainer("iql", REACH, IQLConfig(dataset="reach/mixed-v0", **SMALL), datasets, 2)
    iql.train()
    iql.write_checkpoint(tmp_path / "iql" / "model")
    iql.close()
    cql = trainer("cql", REACH, CQLConfig(dataset="reach/mixed-v0", **SMALL), datasets, 2)
    cql.train()
    cql.write_checkpoint(tmp_path / "cql" / "model")
    cql.close()
    for argv, says in (
        (["--init-from", str(tmp_path / "iql")], "holds a run of iql; sac goes on from a run of cql"),
        (["--init-from", str(tmp_path / "cql")], "has networks (64, 64) (relu); this run's are net_arch=(256, 256)"),
        (["--keep-dataset"], "keep_dataset=True is not allowed"),
        (
            ["--init-from", str(tmp_path / "cql"), "--net-arch", "64", "64", "--strategy", "actor-learner"],
            "sac goes on from a CQL run under single or ddp",
        ),
    ):
        run_dir = tmp_path / "run"
        assert main(["train", "sac", REACH, *argv, "--run-dir", str(run_dir)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("distrl: error: ") and says in err[0], err
        assert not run_dir.exists()


def test_a_dataset_on_disk_trains_as_in_memory_and_its_files_go_with_the_run(datasets, tmp_path):
    ends = {}
    for on_disk in (False, True):
        cfg = TD3BCConfig(dataset="mcc/mixed-v0", datasets_dir=str(datasets), dataset_on_disk=on_disk, **SMALL)
        run_cfg = RunConfig(algo="td3bc", env="MountainCarContinuous-v0", total_steps=8, seed=0, quiet=True)
        t = OfflineTrainer(run_cfg, cfg, run_dir=tmp_path / str(on_disk))
        t.train()
        folder = tmp_path / str(on_disk) / ".dataset-rank0"
        assert folder.is_dir() == on_disk
        if on_disk:
            assert isinstance(t.data.obs, np.memmap) and (folder / "obs.npy").stat().st_size > t.data.obs.nbytes
        ends[on_disk] = t.state_tensors()
        t.close()
        assert not folder.exists()
    for name, value in ends[False].items():
        assert torch.equal(ends[True][name], value), name


def test_the_learning_benchmark_goes_on_from_a_stopped_run_as_if_it_had_not_stopped(datasets, tmp_path, monkeypatch):
    """benchmarks/offline_learning.py --work-dir: a run killed between two evaluations goes on from its state at the
    last one, to the same curve and the same networks as a run that was not stopped."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parents[2] / "benchmarks"))
    import offline_learning as bench

    monkeypatch.setattr(
        bench, "evaluate", lambda act, env_id, episodes: float(act(np.array([[-0.5, 0.0]], np.float32))[0, 0])
    )
    settings = dict(
        env="MountainCarContinuous-v0",
        dataset="mcc/mixed-v0",
        root=str(datasets),
        steps=30,
        eval_every=10,
        eval_episodes=1,
        seed=0,
    )

    def run(folder, stop_at=None, **changed):
        learner = bench.DistrlLearner("td3bc", {**settings, **changed})
        train_to = learner.train_to

        def killed_past_stop_at(step):
            if stop_at is not None and step > stop_at:
                raise SystemExit("killed")
            train_to(step)

        learner.train_to = killed_past_stop_at
        try:
            curve, _ = bench.learn(learner, {**settings, **changed}, folder, 0.0)
            return curve, learner.trainer.state_tensors()
        finally:
            learner.close()

    whole_curve, whole = run(tmp_path / "whole")
    with pytest.raises(SystemExit, match="killed"):
        run(tmp_path / "cut", stop_at=10)
    assert [p.name for p in (tmp_path / "cut").iterdir()] == ["at-10"]
    cut_curve, cut = run(tmp_path / "cut")
    _, other = run(tmp_path / "other", seed=1)
    assert cut_curve == whole_curve and [p[0] for p in cut_curve] == [0, 10, 20, 30]
    for name, value in whole.items():
        assert torch.equal(cut[name], value), name
    assert not torch.equal(other["algo/actor/net.0.weight"], whole["algo/actor/net.0.weight"])  # it can fail
    assert [p.name for p in (tmp_path / "whole").iterdir()] == ["at-20"]  # each evaluation's state but the last's
    with pytest.raises(SystemExit, match="was left by a run with"):
        run(tmp_path / "whole", steps=40)
