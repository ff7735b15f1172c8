"""Offline datasets: what distrl writes Minari reads back; loading gives the episodes' transitions, rank shards and
the global sampler add up to the single-process data and batch; user mistakes are one-line errors."""

import os
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from distrl.config import ConfigError
from distrl.data.minari_store import check_spaces, open_dataset, write_dataset
from distrl.data.offline import GlobalSampler, OfflineData

minari = pytest.importorskip("minari")

CARTPOLE = "cartpole/random-v0"
PENDULUM = "pendulum/random-v0"


def random_episodes(env_id: str, caps: list[int], seed: int) -> list[dict]:
    """One episode per cap, random actions, cut (truncated) after ``cap`` steps unless it terminates first."""
    env = gym.make(env_id)
    env.action_space.seed(seed)
    episodes = []
    for k, cap in enumerate(caps):
        obs, _ = env.reset(seed=seed + k)
        observations, actions, rewards, terminations, truncations = [obs], [], [], [], []
        for t in range(cap):
            action = env.action_space.sample()
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs)
            actions.append(action)
            rewards.append(reward)
            terminations.append(terminated)
            truncations.append(truncated or (t == cap - 1 and not terminated))
            if terminated or truncated:
                break
        episodes.append(
            {
                "observations": np.stack(observations),
                "actions": np.stack(actions),
                "rewards": np.array(rewards),
                "terminations": np.array(terminations),
                "truncations": np.array(truncations),
                "seed": seed + k,
            }
        )
    env.close()
    return episodes


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A CartPole dataset of five episodes (terminated and truncated ones) and a Pendulum one of three, in one
    folder of datasets; returns (folder, {id: (env_id, episodes)})."""
    root = tmp_path_factory.mktemp("datasets")
    datasets = {
        CARTPOLE: ("CartPole-v1", random_episodes("CartPole-v1", [50, 6, 50, 50, 9], seed=1)),
        PENDULUM: ("Pendulum-v1", random_episodes("Pendulum-v1", [7, 4, 5], seed=2)),
    }
    for dataset_id, (env_id, episodes) in datasets.items():
        env = gym.make(env_id)
        path = write_dataset(
            dataset_id, episodes, env_id, env.observation_space, env.action_space, "random", datasets_dir=str(root)
        )
        assert path == str(root / dataset_id)
    return root, datasets


def expected_transitions(episodes: list[dict]) -> dict[str, np.ndarray]:
    """The transitions worked out from the episodes by hand, one episode after the other."""
    return {
        "obs": np.concatenate([e["observations"][:-1] for e in episodes]),
        "next_obs": np.concatenate([e["observations"][1:] for e in episodes]),
        "actions": np.concatenate([e["actions"] for e in episodes]),
        "rewards": np.concatenate([e["rewards"] for e in episodes]).astype(np.float32),
        "terminated": np.concatenate([e["terminations"] for e in episodes]).astype(np.float32),
    }


FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated", "global_index")


def assert_same_data(a: OfflineData, b: OfflineData) -> None:
    for f in FIELDS:
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
        assert getattr(a, f).dtype == getattr(b, f).dtype
    assert a.episode_returns == b.episode_returns
    assert a.global_size == b.global_size


@pytest.mark.parametrize("dataset_id", [CARTPOLE, PENDULUM])
def test_written_dataset_reads_back_in_minari(written, monkeypatch, dataset_id):
    root, datasets = written
    env_id, episodes = datasets[dataset_id]
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    dataset = minari.load_dataset(dataset_id)
    assert dataset.total_episodes == len(episodes)
    assert dataset.total_steps == sum(len(e["rewards"]) for e in episodes)
    assert dataset.env_spec.id == env_id
    assert dataset.storage.metadata["algorithm_name"] == "random"
    assert sorted(minari.list_local_datasets()) == sorted(datasets)
    for episode, read in zip(episodes, dataset.iterate_episodes(), strict=True):
        for key in ("observations", "actions", "rewards", "terminations", "truncations"):
            np.testing.assert_array_equal(getattr(read, key), episode[key])
    # the staging folder is gone: the folder holds the datasets' namespaces and nothing else
    assert sorted(os.listdir(root)) == ["cartpole", "pendulum"]


def test_writing_never_overwrites_leaves_nothing_half_written_and_the_environment_alone(written, tmp_path, monkeypatch):
    root, datasets = written
    monkeypatch.delenv("MINARI_DATASETS_PATH", raising=False)
    env_id, episodes = datasets[CARTPOLE]
    spaces = gym.make(env_id).observation_space, gym.make(env_id).action_space
    with pytest.raises(ConfigError, match=r"^dataset_id='cartpole/random-v0' already exists in .*; choose"):
        write_dataset(CARTPOLE, episodes, env_id, *spaces, "x", datasets_dir=str(root))
    with pytest.raises(ConfigError, match=r"^dataset_id='cartpole' is not a Minari id"):
        write_dataset("cartpole", episodes, env_id, *spaces, "x", datasets_dir=str(tmp_path))
    # Minari refuses observations of another shape than the space's midway through writing: nothing is left
    with pytest.raises(AssertionError):
        write_dataset("broken-v0", episodes, env_id, gym.spaces.Box(-1, 1, (3,)), spaces[1], "x", str(tmp_path))
    assert os.listdir(tmp_path) == []
    path = write_dataset("cartpole/copy-v0", episodes[:1], env_id, *spaces, "x", datasets_dir=str(tmp_path))
    assert path == str(tmp_path / "cartpole/copy-v0")
    assert sorted(os.listdir(tmp_path)) == ["cartpole"]
    assert open_dataset(path).total_episodes == 1
    assert "MINARI_DATASETS_PATH" not in os.environ


def test_the_size_is_measured_once_not_after_every_episode_and_is_minaris_measure(tmp_path, monkeypatch):
    # Minari's writer walks the dataset's folder after every episode to record its size: quadratic in episodes
    from minari.dataset.minari_storage import MinariStorage

    walks = []
    walk = MinariStorage.get_size

    def counted(storage):
        walks.append(1)
        return walk(storage)

    monkeypatch.setattr(MinariStorage, "get_size", counted)
    episodes = random_episodes("CartPole-v1", [3] * 40, seed=3)
    env = gym.make("CartPole-v1")
    path = write_dataset(
        "short/many-v0", episodes, "CartPole-v1", env.observation_space, env.action_space, "random", str(tmp_path)
    )
    assert len(walks) == 1  # 41 before: one per episode and one at the end
    storage = open_dataset(path).storage
    assert storage.total_episodes == 40
    assert storage.metadata["dataset_size"] == walk(storage) > 0
    assert MinariStorage.get_size is counted  # put back as it was


@pytest.mark.parametrize("dataset_id", [CARTPOLE, PENDULUM])
def test_load_gives_the_episodes_transitions(written, dataset_id):
    root, datasets = written
    env_id, episodes = datasets[dataset_id]
    data = OfflineData.load(open_dataset(dataset_id, datasets_dir=str(root)))
    expected = expected_transitions(episodes)
    env = gym.make(env_id)
    for f, values in expected.items():
        np.testing.assert_array_equal(getattr(data, f), values)
    assert data.obs.dtype == data.next_obs.dtype == env.observation_space.dtype
    assert data.actions.dtype == (np.int64 if isinstance(env.action_space, gym.spaces.Discrete) else np.float32)
    assert data.size == data.global_size == len(expected["rewards"])
    np.testing.assert_array_equal(data.global_index, np.arange(data.size))
    assert data.episode_returns == pytest.approx([float(e["rewards"].sum()) for e in episodes], rel=1e-12)
    if dataset_id == CARTPOLE:
        # both endings occur, and only a termination stops the bootstrap
        assert any(e["terminations"][-1] for e in episodes) and any(e["truncations"][-1] for e in episodes)
        assert data.terminated.sum() == sum(e["terminations"].sum() for e in episodes) > 0


def test_rank_shards_cover_the_dataset_and_chunks_change_nothing(written):
    root, _ = written
    dataset = open_dataset(str(root / CARTPOLE))  # by path this time
    whole = OfflineData.load(dataset)
    shards = [OfflineData.load(dataset, rank=r, world_size=2) for r in (0, 1)]
    assert [len(s.episode_returns) for s in shards] == [3, 2]
    assert sum(s.size for s in shards) == whole.size
    assert {s.global_size for s in shards} == {whole.global_size}
    index = np.concatenate([s.global_index for s in shards])
    order = np.argsort(index)
    np.testing.assert_array_equal(index[order], whole.global_index)
    for f in FIELDS:
        np.testing.assert_array_equal(np.concatenate([getattr(s, f) for s in shards])[order], getattr(whole, f))
    assert_same_data(OfflineData.load(dataset, episodes_per_chunk=1), whole)
    assert_same_data(OfflineData.load(dataset, rank=1, world_size=2, episodes_per_chunk=1), shards[1])
    # more ranks than episodes: a rank may hold nothing
    empty = OfflineData.load(dataset, rank=6, world_size=7)
    assert empty.size == 0 and empty.global_size == whole.global_size


def test_global_sampler_splits_the_single_process_batch_over_ranks(written):
    root, _ = written
    dataset = open_dataset(CARTPOLE, datasets_dir=str(root))
    whole = OfflineData.load(dataset)
    shards = [OfflineData.load(dataset, rank=r, world_size=2, episodes_per_chunk=2) for r in (0, 1)]
    single, draws = GlobalSampler(seed=5, segment=1), GlobalSampler(seed=5, segment=1)
    ranks = [GlobalSampler(seed=5, segment=1) for _ in shards]
    for _ in range(3):  # the generators stay in lockstep over batches
        drawn = draws.draw(whole.global_size, 256)
        assert len(np.unique(drawn)) < len(drawn)  # repeats, as with replacement: each must be kept
        batch, global_batch_size = single.batch(whole, 256, "cpu")
        parts = [sampler.batch(shard, 256, "cpu") for sampler, shard in zip(ranks, shards)]
        assert global_batch_size == 256 and [size for _, size in parts] == [256, 256]
        assert batch.rows is None  # one process holds the whole batch, in the order drawn
        positions, rows = whole.locate(drawn)
        np.testing.assert_array_equal(positions, np.arange(256))
        np.testing.assert_array_equal(rows, np.searchsorted(whole.global_index, drawn))  # row i holds index i
        assert torch.equal(batch.obs, torch.from_numpy(whole.obs[drawn]))
        # the ranks' positions in the global batch cover it exactly once ...
        np.testing.assert_array_equal(np.sort(np.concatenate([part.rows for part, _ in parts])), np.arange(256))
        # ... their samples are the drawn global indices, which they hold, and equal the single batch's there
        held = []
        for (part, _), shard in zip(parts, shards):
            held.append(drawn[part.rows])
            assert np.isin(drawn[part.rows], shard.global_index).all()
            for f in ("obs", "actions", "rewards", "next_obs", "terminated"):
                assert torch.equal(getattr(part, f), getattr(batch, f)[part.rows])
        np.testing.assert_array_equal(np.sort(np.concatenate(held)), np.sort(drawn))
    other = GlobalSampler(seed=5, segment=2).draw(whole.global_size, 256)
    assert not np.array_equal(other, GlobalSampler(seed=5, segment=1).draw(whole.global_size, 256))


def test_unknown_id_is_one_line_naming_where_it_looked(written):
    root, _ = written
    with pytest.raises(ConfigError) as error:
        open_dataset("hopper/medium-v0", datasets_dir=str(root))
    message = str(error.value)
    assert "\n" not in message
    assert message == (
        f"dataset='hopper/medium-v0' is not in {root} (local datasets: {CARTPOLE}, {PENDULUM}); nothing is downloaded"
    )


def test_a_directory_that_is_no_dataset_is_one_line_with_minari_reason(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError) as error:
        open_dataset(str(tmp_path / "empty"))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        f"dataset='{tmp_path / 'empty'}': {tmp_path / 'empty'} is not a dataset Minari can open: "
    )
    assert "doesn't exist" in message  # Minari's reason: no data/ folder
    with pytest.raises(ConfigError, match=r"^dataset='/nowhere/at-all' is not a directory"):
        open_dataset("/nowhere/at-all")


def test_spaces_other_than_the_env_are_one_line_naming_the_space(written):
    root, _ = written
    dataset = open_dataset(CARTPOLE, datasets_dir=str(root))
    env = gym.make("CartPole-v1")
    check_spaces(dataset, env.observation_space, env.action_space, "CartPole-v1")
    with pytest.raises(ConfigError) as error:
        check_spaces(dataset, env.observation_space, gym.spaces.Discrete(3), "CartPole-v1")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        f"dataset='{CARTPOLE}' has action_space Discrete(2) but env_id='CartPole-v1' has Discrete(3);"
    )
    pendulum = gym.make("Pendulum-v1")
    with pytest.raises(ConfigError, match=r"^dataset='cartpole/random-v0' has observation_space Box\(") as error:
        check_spaces(dataset, pendulum.observation_space, pendulum.action_space, "Pendulum-v1")
    assert "\n" not in str(error.value)


def test_without_minari_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "minari", None)
    with pytest.raises(
        ConfigError, match=r"^offline datasets: reading or writing one needs the minari package \(pip install minari\)"
    ):
        open_dataset("cartpole/random-v0")


def test_a_relative_datasets_dir_writes_and_reads_back(written, tmp_path, monkeypatch):
    """``--datasets-dir ds`` as a user types it: Minari's writer, given a relative folder, joined it to itself when
    it sized the files it wrote; distrl hands it an absolute one."""
    _, datasets = written
    env_id, episodes = datasets[PENDULUM]
    monkeypatch.chdir(tmp_path)
    env = gym.make(env_id)
    path = write_dataset("pendulum/rel-v0", episodes, env_id, env.observation_space, env.action_space, "x", "ds")
    assert path == str(tmp_path / "ds" / "pendulum/rel-v0")
    assert open_dataset("pendulum/rel-v0", "ds").total_episodes == len(episodes)


def test_a_shard_on_disk_holds_what_memory_does_and_its_moments(written, tmp_path):
    root, _ = written
    dataset = open_dataset(str(root / CARTPOLE))
    for rank, world in ((0, 1), (1, 2), (6, 7)):  # the whole, a shard, an empty shard
        in_memory = OfflineData.load(dataset, rank, world)
        on_disk = OfflineData.load(dataset, rank, world, episodes_per_chunk=1, folder=tmp_path / f"r{rank}")
        assert_same_data(on_disk, in_memory)
        if in_memory.size:
            assert all(isinstance(getattr(on_disk, f), np.memmap) for f in FIELDS)
            assert not on_disk.obs.flags.writeable
    whole = OfflineData.load(dataset, folder=tmp_path / "w")
    obs = whole.obs.astype(np.float64)
    expected = np.concatenate([[len(obs)], obs.sum(0), np.square(obs).sum(0)])
    np.testing.assert_allclose(whole.moments(rows_per_read=7), expected, rtol=1e-12)
