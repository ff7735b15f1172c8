"""Text environments for GRPO: multi-turn episodes token in, token out; what learns from them; the adapters; errors.

Every model is a tiny random causal LM with a character tokenizer, loaded through ``--model PATH`` as a real one.
"""

import dataclasses
import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from distrl.algos.grpo import GRPOAlgo
from distrl.algos.protocols import LocalSync
from distrl.cli import main
from distrl.config import ConfigError, GRPOConfig, RunConfig
from distrl.data.groups import draw_groups, sampling_uniforms, score_groups
from distrl.nets.causal_lm import CausalLMPolicy
from distrl.nets.distributions import sample_tokens
from distrl.tasks.group import make_group_task
from distrl.tasks.text_envs import TextEnvTask, episode_seeds, load_env_factory
from distrl.training.group import train_grpo

transformers = pytest.importorskip("transformers")
from distrl_lm import make_model  # noqa: E402
from distrl_textenvs import DIGITS, Talker  # noqa: E402

CHARS = "012<>="
TALKER = "distrl_textenvs:talker"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("lm") / "model", chars=CHARS, seed=1)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    # the template writes "u:" and "a:" around messages: the vocabulary has their characters
    return make_model(tmp_path_factory.mktemp("chat") / "model", arch="gpt2", chars="012<>=ua:", chat_template=True)


def talker_task(model, max_new_tokens=8, max_turn_tokens=3, max_turns=4, **changes):
    cfg = GRPOConfig(
        model=model, max_new_tokens=max_new_tokens, max_turn_tokens=max_turn_tokens, max_turns=max_turns, **changes
    )
    return make_group_task(TALKER, cfg, seed=0), CausalLMPolicy(model, max_new_tokens=max_new_tokens)


def as_tensors(samples):
    return [torch.from_numpy(a) for a in (samples.prompt, samples.prompt_mask, samples.tokens, samples.attention)]


# ---- learning ----


def test_a_tiny_model_learns_to_use_the_environments_answers(tmp_path):
    # a hidden digit in {0, 1, 2}; a guess a turn, answered '<' or '>', reward 1 if right within two guesses.
    # Without the answers a policy guesses two fixed digits: at best right 2/3 of the time.
    open_loop = max(np.mean([h in (a, b) for h in DIGITS]) for a, b in itertools.product(DIGITS, repeat=2))
    assert open_loop == pytest.approx(2 / 3)
    cfg = GRPOConfig(
        model=make_model(tmp_path / "model", chars=CHARS, seed=0),
        max_new_tokens=2,
        max_turn_tokens=1,
        max_turns=2,
        group_size=8,
        prompts_per_slice=8,
        slices_per_step=1,
        learner_steps=100,
        learning_rate=3e-3,
        sample_every=0,
    )
    # seeds 0-4 all reached greedy success 1.0 within these 100 steps (2.5-4 s each on one core)
    run = RunConfig(algo="grpo", env="distrl_textenvs:hidden_digit", seed=0, quiet=True)
    summary = train_grpo(run, cfg, tmp_path / "run")
    assert summary["reward_first"] < 0.5, summary["reward_first"]  # from scratch: mostly not even a digit
    assert summary["eval_reward"] > 0.9 > open_loop + 0.2, summary["eval_reward"]
    # a right first guess ends the episode: with answers used, turns average between 1 and 2
    assert 1.0 < summary["eval_turns"] < 2.0 and summary["eval_env_tokens"] == summary["eval_turns"] - 1


# ---- token in, token out ----


def test_environment_tokens_are_attended_carry_no_loss_and_no_gradient(model):
    task, policy = talker_task(model)
    samples = score_groups(task, draw_groups(task, policy, np.arange(4), 4, seed=3, version=0))
    env = samples.attention & ~samples.mask
    assert env.sum() > 0 and (samples.turns > 1).all()
    assert (samples.log_probs[env] == 0).all() and not (samples.mask & ~samples.attention).any()
    for row in range(samples.size):  # the real tokens are one prefix: model turns and answers interleaved
        length = samples.attention[row].sum()
        assert samples.attention[row, :length].all() and not samples.attention[row, length:].any()
    assert samples.reward.tolist() == samples.env_return.tolist()
    cfg = GRPOConfig(model=model, max_new_tokens=8, loss_type="grpo")

    def gradient(batch):
        before = policy.params.data.clone()
        GRPOAlgo(cfg, policy).update(batch, LocalSync())
        grad = policy.params.grad.clone()
        policy.params.data.copy_(before)
        return grad

    noise = np.random.default_rng(0).normal(0, 3, samples.log_probs.shape).astype(np.float32)
    at_env = dataclasses.replace(samples, log_probs=np.where(env, noise, samples.log_probs))
    at_model = dataclasses.replace(samples, log_probs=np.where(samples.mask, samples.log_probs + 0.3, 0))
    reference = gradient(samples)
    assert reference.abs().sum() > 0
    assert torch.equal(gradient(at_env), reference)  # whatever the env tokens' entries hold
    assert not torch.allclose(gradient(at_model), reference)  # the model's tokens do count


def test_the_models_tokens_are_the_drawn_ids_never_retokenised_and_take_their_uniforms_in_order(model):
    Talker.made.clear()
    task, policy = talker_task(model, max_new_tokens=9, max_turn_tokens=3)
    positions = np.arange(4)
    samples = draw_groups(task, policy, positions, 3, seed=7, version=0)
    uniforms = torch.from_numpy(sampling_uniforms(7, positions, 3, 9)).float()
    # replay every model token from the learner's logits and that completion's uniforms, k-th token k-th uniform
    prompt, prompt_mask, tokens, attention = as_tensors(samples)
    ids = torch.cat([prompt, tokens], 1)
    mask = torch.cat([prompt_mask, attention], 1).long()
    with torch.no_grad():
        logits = policy.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
    P, retokenised_differs = prompt.shape[1], 0
    envs = Talker.made[-samples.size :]
    for row in range(samples.size):
        where = np.flatnonzero(samples.mask[row])
        replayed, _ = sample_tokens(logits[row, P - 1 + where], uniforms[row, : len(where)], policy.temperature)
        assert replayed.tolist() == samples.tokens[row, where].tolist()
        turns = np.split(where, np.flatnonzero(np.diff(where) > 1) + 1)  # runs of model tokens: its turns
        assert len(turns) == samples.turns[row] == len(envs[row].heard)
        for turn, heard in zip(turns, envs[row].heard):
            drawn = samples.tokens[row, turn].tolist()
            assert heard == policy.tokenizer.decode(drawn, skip_special_tokens=True)
            retokenised_differs += policy.tokenizer(heard, add_special_tokens=False)["input_ids"] != drawn
    # a random model draws <bos>, <pad> and <unk> too: their text is empty, so encoding it again loses them
    assert retokenised_differs > 0


@pytest.mark.parametrize("chat", [False, True])
def test_behaviour_log_probs_are_the_learners_on_the_models_tokens(model, chat_model, chat):
    name = "distrl_textenvs:chatty" if chat else TALKER
    path = chat_model if chat else model
    cfg = GRPOConfig(model=path, max_new_tokens=8, max_turn_tokens=3, max_turns=3)
    task = make_group_task(name, cfg, seed=0)
    policy = CausalLMPolicy(path, max_new_tokens=8)
    samples = draw_groups(task, policy, np.arange(5), 3, seed=1, version=0)
    learner = policy.token_log_probs(*as_tensors(samples)).detach()
    mask = torch.from_numpy(samples.mask)
    assert torch.allclose(learner[mask], torch.from_numpy(samples.log_probs)[mask], atol=2e-5)
    if chat:  # an answer is the template's delta for one user message: "u:<n>a:", n the turn's characters
        for row in range(samples.size):
            env = samples.attention[row] & ~samples.mask[row]
            answers = policy.tokenizer.decode(samples.tokens[row, env].tolist())
            assert answers.startswith("u:") and answers.endswith("a:") and answers.count("u:") == samples.turns[row] - 1
    greedy = draw_groups(task, policy, np.arange(5), 1, seed=1, version=0, greedy=True)
    assert np.array_equal(
        greedy.tokens, draw_groups(task, policy, np.arange(5), 1, seed=2, version=0, greedy=True).tokens
    )


def test_episodes_end_at_max_turns_the_token_budget_or_the_environment(model):
    task, policy = talker_task(model, max_new_tokens=5, max_turn_tokens=2, max_turns=2)
    samples = draw_groups(task, policy, np.arange(6), 2, seed=0, version=0)
    assert (samples.turns <= 2).all() and (samples.mask.sum(1) <= 5).all() and samples.mask.any(1).all()
    task, policy = talker_task(model, max_new_tokens=4, max_turn_tokens=1, max_turns=8)
    samples = draw_groups(task, policy, np.arange(6), 2, seed=0, version=0)
    assert (samples.mask.sum(1) == 4).all() and (samples.turns == 4).all()  # one token a turn, budget 4
    cfg = GRPOConfig(model=model, max_new_tokens=2, max_turn_tokens=1, max_turns=5)
    digit = make_group_task("distrl_textenvs:hidden_digit", cfg, seed=0)
    samples = draw_groups(digit, CausalLMPolicy(model, max_new_tokens=2), np.arange(6), 2, seed=0, version=0)
    # the environment ends an episode after one wrong non-digit or a right guess, never past two guesses
    assert (samples.turns <= 2).all() and set(samples.env_return.tolist()) <= {0.0, 1.0}


def test_rows_seeds_and_rewards_on_transcripts(model, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"p{i}", "size": i}) + "\n" for i in range(3)))
    cfg = GRPOConfig(
        model=model,
        dataset=str(data),
        rewards=("distrl_textenvs:transcript_length",),
        reward_weights=(0.5,),
        reward_workers=0,
        max_new_tokens=6,
        max_turn_tokens=2,
        max_turns=3,
    )
    Talker.made.clear()
    task = make_group_task(TALKER, cfg, seed=4)
    assert task.reward_names == ("env", "distrl_textenvs:transcript_length")
    assert task.reward_weights.tolist() == [1.0, 0.5]
    samples = draw_groups(task, CausalLMPolicy(model, max_new_tokens=6), np.arange(3), 2, seed=4, version=0)
    scored = score_groups(task, samples)
    lengths = np.array([len(t) for t in samples.texts], dtype=np.float32)
    assert scored.rewards[:, 1].tolist() == lengths.tolist() and np.allclose(
        scored.reward, samples.env_return + 0.5 * lengths
    )
    # reset saw the dataset's line plus the group's seed (keyed by run seed and position) and the member
    rows = [env.row for env in Talker.made[-6:]]
    seeds = episode_seeds(4, np.arange(3))
    assert [r["seed"] for r in rows] == [s for s in seeds for _ in range(2)] and len(set(seeds)) == 3
    assert [r["member"] for r in rows] == [0, 1] * 3 and {r["prompt"] for r in rows} == {"p0", "p1", "p2"}
    assert episode_seeds(5, np.arange(3)) != seeds
    without = make_group_task(TALKER, GRPOConfig(model=model), seed=4)
    assert without.prompts(np.array([7, 8])) == [{"index": 7}, {"index": 8}]


# ---- strategies and resume ----


def grpo_args(model, run_dir, *flags):
    return [
        "train",
        "grpo",
        TALKER,
        "--model",
        model,
        "--env-kwargs",
        "answer=<>=",
        "--reward",
        "distrl_textenvs:transcript_length",
        "--reward-weights",
        "0.1",
        "--reward-workers",
        "0",
        "--max-new-tokens",
        "6",
        "--max-turn-tokens",
        "2",
        "--max-turns",
        "3",
        "--group-size",
        "4",
        "--prompts-per-slice",
        "2",
        "--learning-rate",
        "3e-3",
        "--quiet",
        "--run-dir",
        str(run_dir),
        *flags,
    ]


def params(run_dir, checkpoint="model"):
    tensors = load_file(str(Path(run_dir) / checkpoint / "tensors.safetensors"))
    return {k: v for k, v in tensors.items() if k.startswith("params/")}


def largest_difference(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def summary(run_dir):
    return json.loads((Path(run_dir) / "summary.json").read_text())


def cli(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "distrl", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.multiprocess
@pytest.mark.heavy
def test_single_resumes_exactly_and_ddp_and_pipeline_draw_the_same_episodes(model, tmp_path, ray_local):
    flags = ("--learner-steps", "4", "--slices-per-step", "2", "--slices-per-call", "2")
    assert main(grpo_args(model, tmp_path / "single", *flags, "--checkpoint-every", "2")) == 0
    single = params(tmp_path / "single")
    s = summary(tmp_path / "single")
    assert s["completions"] == 4 * 4 * 4 and s["eval_prompts"] == 64 and "eval_reward/env" in s
    # a checkpoint sits between groups: going on from step 2 draws what the uninterrupted run drew
    shutil.rmtree(tmp_path / "single" / "model")
    resume = ["train", "grpo", "--resume", str(tmp_path / "single" / "checkpoints" / "step-000000000002"), "--quiet"]
    assert main(resume) == 0
    assert largest_difference(single, params(tmp_path / "single")) == 0.0
    # in this process: ddp's ranks launched from here, the pipeline on the session's Ray instance
    ddp = ("--strategy", "ddp", "--workers", "2")
    assert main([*grpo_args(model, tmp_path / "ddp", "--learner-steps", "4", "--slices-per-step", "1"), *ddp]) == 0
    assert largest_difference(single, params(tmp_path / "ddp")) < 2e-5
    pipeline = ("--strategy", "pipeline", "--workers", "1", "--queue-size", "2")
    assert main([*grpo_args(model, tmp_path / "pipe", *flags), *pipeline]) == 0
    assert largest_difference(single, params(tmp_path / "pipe")) < 1e-5
    assert summary(tmp_path / "pipe")["policy_lag_max"] == 0


def test_a_run_copied_from_elsewhere_imports_its_environment_only_when_named_again(model, tmp_path):
    assert main(grpo_args(model, tmp_path / "run", "--learner-steps", "1", "--slices-per-step", "1")) == 0
    copied = tmp_path / "copied"
    shutil.copytree(tmp_path / "run", copied)
    refused = cli("train", "grpo", "--resume", str(copied), "--reward", "distrl_textenvs:transcript_length")
    assert refused.returncode == 2 and f"env={TALKER!r}" in refused.stderr and "Traceback" not in refused.stderr
    named = ["train", "grpo", TALKER, "--resume", str(copied), "--reward", "distrl_textenvs:transcript_length"]
    assert main([*named, "--quiet"]) == 0  # named by the user again: their say-so


# ---- the adapters ----


def test_reasoning_gym_entries_are_scored_by_the_tasks_own_check(model):
    rg = pytest.importorskip("reasoning_gym")
    task = TextEnvTask("reasoning_gym/basic_arithmetic", {"size": 20}, seed=3)
    envs, first = task.start(np.array([4, 25]), 2)
    entries = [rg.create_dataset("basic_arithmetic", size=20, seed=3)[i] for i in (4, 5)]  # position 25 wraps to 5
    assert first == [entries[0]["question"]] * 2 + [entries[1]["question"]] * 2
    right = envs[0].step(f"<answer>{entries[0]['answer']}</answer>")
    assert right.reward == 1.0 and right.terminated
    assert envs[1].step(str(int(entries[0]["answer"]) + 1)).reward == 0.0
    assert envs[2].step(entries[1]["answer"]).reward == 1.0  # no tags: the whole turn is the answer
    cfg = GRPOConfig(model=model, max_new_tokens=4)
    played = draw_groups(
        make_group_task("reasoning_gym/basic_arithmetic", cfg),
        CausalLMPolicy(model, max_new_tokens=4),
        np.arange(2),
        2,
        0,
        0,
    )
    assert (played.turns == 1).all() and not (played.attention & ~played.mask).any()


def test_a_textarena_game_plays_to_its_end_with_scripted_turns():
    pytest.importorskip("textarena")
    task = TextEnvTask("textarena/GuessTheNumber-v0", {}, seed=0)
    envs, first = task.start(np.array([0]), 2)
    assert "Guess The Number" in first[0]
    transcripts = []
    for env in envs:  # binary search on the game's hints
        low, high, said, answer = 1, 20, [], None
        for _ in range(10):
            guess = (low + high) // 2
            answer = env.step(f"[{guess}]")
            said.append(answer.observation)
            if answer.terminated:
                break
            assert "[GAME]" in answer.observation and "Guess The Number" not in answer.observation  # only what is new
            low, high = (guess + 1, high) if "higher" in answer.observation else (low, guess - 1)
        assert answer.terminated and answer.reward == 1.0
        transcripts.append(said)
    assert transcripts[0] == transcripts[1]  # a group plays one game: the same number behind the same seed


# ---- errors ----


@pytest.mark.parametrize(
    "name, kwargs, message",
    [
        ("reasoning_gym/basic_arithmetik", {}, "is not a reasoning-gym task: must be reasoning_gym/<task> (did you"),
        ("reasoning_gym/basic_arithmetic", {"nope": 1}, "env_kwargs={'nope': 1} is not allowed for env="),
        ("textarena/NoSuchGame-v0", {}, "is not a TextArena environment: must be textarena/<EnvId>"),
        ("distrl_textenvs:not_callable", {}, "is a int, not a function: must be a factory(**env_kwargs)"),
        ("distrl_textenvs:no_step", {}, "made a OnlyReset, which has no step method: a text environment has"),
        ("distrl_textenvs:hidden_digit", {"tries": 3}, "env_kwargs={'tries': 3} is not allowed for env="),
        ("distrl_textenvs:nothing_here", {}, "module 'distrl_textenvs' has no 'nothing_here'"),
        ("no_such_module_here:factory", {}, "cannot import module 'no_such_module_here'"),
    ],
)
def test_a_wrong_environment_is_a_one_line_error_before_anything_is_drawn(name, kwargs, message):
    with pytest.raises(ConfigError) as caught:
        load_env_factory(name, kwargs, seed=0)
    assert message in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_wrong_answers_missing_packages_and_flags_are_one_line_errors(model, tmp_path, monkeypatch, capsys):
    env = load_env_factory("distrl_textenvs:wrong_step", {}, seed=0)()
    env.reset({})
    with pytest.raises(
        ConfigError, match=r"step returned tuple \('1', 0.0\): must return a tuple \(observation, reward"
    ):
        env.step("1")
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=r"needs the reasoning-gym package \(pip install 'distrl\[textenvs\]'\)"):
        load_env_factory("reasoning_gym/basic_arithmetic", {}, seed=0)
    with pytest.raises(ConfigError, match="model='' is not allowed with env='distrl_textenvs:talker'"):
        make_group_task(TALKER, GRPOConfig(), seed=0)
    seeded = tmp_path / "seeded.jsonl"
    seeded.write_text('{"a": 1}\n{"seed": 3}\n')
    with pytest.raises(ConfigError, match="seeded.jsonl' line 2 has a field 'seed', which distrl sets"):
        make_group_task(TALKER, GRPOConfig(model=model, dataset=str(seeded)), seed=0)
    with pytest.raises(ConfigError, match="has no field 'answer', which reward 'exact_match' needs"):
        make_group_task(TALKER, GRPOConfig(model=model, rewards=("exact_match",)), seed=0)
    for args, text in [
        (["distrl_textenvs:no_step", "--model", model], "which has no step method"),
        ([TALKER, "--model", str(tmp_path / "nowhere")], "is not a directory: must be a local directory"),
        (["bandit", "--env-kwargs", "a=1"], "env_kwargs=('a=1',) is not allowed for grpo"),
    ]:
        assert main(["train", "grpo", *args, "--run-dir", str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err.strip()
        assert text in err and "\n" not in err, err
