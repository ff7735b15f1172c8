"""Action masks: the masked distribution's math, detection, and no illegal action from any path that acts."""

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from distrl import PPO
from distrl.cli import main
from distrl.config import ConfigError
from distrl.envs import masks
from distrl.nets.distributions import (
    categorical_grad,
    categorical_terms,
    inverse_cdf_sample,
    multi_categorical_terms,
)
from distrl_maskenvs import IllegalAction, MaskedChoiceEnv, method_env

FAST = ["--n-envs", "4", "--n-steps", "32", "--batch-size", "64", "--n-epochs", "2", "--quiet", "--eval-episodes", "4"]


def random_masks(rng, batch, nvec):
    parts = []
    for k in nvec:
        part = rng.random((batch, k)) < 0.5
        part[np.arange(batch), rng.integers(k, size=batch)] = True
        parts.append(part)
    return torch.from_numpy(np.concatenate(parts, 1))


def legal_actions(rng, mask, nvec):
    out, start = [], 0
    for k in nvec:
        out.append([rng.choice(np.flatnonzero(row)) for row in mask[:, start : start + k].numpy()])
        start += k
    return torch.tensor(np.array(out).T)


def test_masked_log_probs_entropies_and_gradients_equal_torch_categorical_with_minus_inf_logits():
    rng = np.random.default_rng(0)
    logits = torch.randn(64, 7, dtype=torch.float64, requires_grad=True)
    mask = random_masks(rng, 64, (7,))
    actions = legal_actions(rng, mask, (7,))[:, 0]
    w_lp, w_ent = torch.randn(64, dtype=torch.float64), torch.randn(64, dtype=torch.float64)

    terms = categorical_terms(masks.mask_logits(logits, mask), actions)
    (ours,) = torch.autograd.grad((w_lp * terms.log_prob + w_ent * terms.entropy).sum(), logits)
    # torch's entropy has NaN gradients at -inf (and at the smallest float64) logits; -1e30 masks as exactly
    # (p = 0), with a fill value other than distrl's
    reference = torch.distributions.Categorical(logits=logits.masked_fill(~mask, -1e30))
    ref_lp, ref_ent = reference.log_prob(actions), reference.entropy()
    (expected,) = torch.autograd.grad((w_lp * ref_lp + w_ent * ref_ent).sum(), logits)

    torch.testing.assert_close(terms.log_prob, ref_lp)
    torch.testing.assert_close(terms.entropy, ref_ent)
    torch.testing.assert_close(ours, expected)
    assert torch.all(ours[~mask] == 0)  # an illegal logit gets no gradient
    # the closed-form gradient the flat-buffer paths use agrees on masked logits too
    closed = categorical_grad(terms, actions, w_lp, w_ent)
    torch.testing.assert_close(closed, expected)
    # an entropy over the legal choices alone: at most the log of their number (log 7 is reached unmasked)
    assert torch.all(terms.entropy <= torch.log(mask.sum(1).double()) + 1e-12)


def test_multi_discrete_masks_apply_per_part():
    rng = np.random.default_rng(1)
    nvec = (3, 4)
    logits = torch.randn(32, 7, dtype=torch.float64, requires_grad=True)
    mask = random_masks(rng, 32, nvec)
    actions = legal_actions(rng, mask, nvec)
    terms = multi_categorical_terms(masks.mask_logits(logits, mask), actions, nvec)
    inf_logits = logits.masked_fill(~mask, -1e30)
    parts = [torch.distributions.Categorical(logits=p) for p in inf_logits.split(nvec, 1)]
    ref_lp = sum(d.log_prob(actions[:, j]) for j, d in enumerate(parts))
    ref_ent = sum(d.entropy() for d in parts)
    torch.testing.assert_close(terms.log_prob, ref_lp)
    torch.testing.assert_close(terms.entropy, ref_ent)
    (ours,) = torch.autograd.grad((terms.log_prob + 0.3 * terms.entropy).sum(), logits)
    (expected,) = torch.autograd.grad((ref_lp + 0.3 * ref_ent).sum(), logits)
    torch.testing.assert_close(ours, expected)


def test_sampling_never_picks_a_masked_choice_even_at_the_edges_of_the_uniform():
    logits = masks.mask_logits(torch.zeros(4, 5), torch.tensor([[0, 1, 1, 0, 0]] * 4)).numpy()
    chosen = inverse_cdf_sample(logits, np.array([0.0, 0.4999, 0.5, np.nextafter(1.0, 0.0)]))
    assert chosen.tolist() == [1, 1, 2, 2]
    many = inverse_cdf_sample(np.repeat(logits[:1], 10_000, 0), np.random.default_rng(0).random(10_000))
    assert set(many.tolist()) == {1, 2} and abs(np.mean(many == 1) - 0.5) < 0.03


@pytest.mark.parametrize(
    "env, extra",
    [
        ("distrl_maskenvs:MaskedChoiceEnv", []),
        ("distrl_maskenvs:method_env", []),
        ("distrl_maskenvs:observation_env", []),
        ("distrl_maskenvs:multi_env", []),
        ("distrl_maskenvs:MaskedChoiceEnv", ["--core", "lstm", "--n-steps", "16", "--batch-size", "32"]),
    ],
    ids=["info", "method", "observation", "multi-discrete", "recurrent"],
)
def test_ppo_never_takes_an_illegal_action_in_10000_steps(tmp_path, env, extra):
    # the env raises on an illegal action: training (sampling), the final evaluation (argmax) and the run's
    # end all go through it
    run = tmp_path / "run"
    main(["train", "ppo", env, "--total-steps", "10000", *FAST, *extra, "--run-dir", str(run)])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["total_steps"] >= 10_000 and summary["final_eval_episodes"] == 4
    recorded = json.loads((run / "config.json").read_text())["run"]["action_mask"]
    assert recorded == {"method_env": "method", "observation_env": "observation"}.get(env.split(":")[1], "info")


def test_without_masks_the_same_env_sees_an_illegal_action(tmp_path):
    with pytest.raises(IllegalAction):
        main(["train", "ppo", "distrl_maskenvs:MaskedChoiceEnv", "--total-steps", "2000", *FAST, "--no-action-mask"])


def test_dqn_explores_and_acts_only_on_legal_actions(tmp_path):
    run = tmp_path / "dqn"
    args = ["--learning-starts", "200", "--train-freq", "4", "--quiet", "--eval-episodes", "4"]
    main(["train", "dqn", "distrl_maskenvs:MaskedChoiceEnv", "--total-steps", "3000", *args, "--run-dir", str(run)])
    assert json.loads((run / "config.json").read_text())["run"]["action_mask"] == "info"


def test_the_learner_recomputes_the_log_probs_the_actor_recorded_under_the_same_masks():
    model = PPO("distrl_maskenvs:MaskedChoiceEnv", n_envs=4, n_steps=32, seed=3)
    trainer = model._trainer
    trainer.collector.reset(3)
    rollout = trainer.collector.collect(0)
    obs = torch.from_numpy(rollout.obs[:-1].reshape(128, -1))
    actions = torch.from_numpy(rollout.actions.reshape(128))
    recomputed = trainer.agent.log_prob(obs, actions).numpy()
    np.testing.assert_allclose(recomputed, rollout.log_probs.reshape(128), atol=1e-6)
    legal = trainer.agent.masks.numpy(rollout.obs[:-1].reshape(128, -1))
    assert legal[np.arange(128), actions.numpy()].all()
    assert (rollout.log_probs > np.log(1 / 6) - 1e-6).mean() > 0.5  # fewer legal choices: likelier ones


def test_predict_and_export_respect_masks(tmp_path):
    model = PPO("distrl_maskenvs:MaskedChoiceEnv", n_envs=2, n_steps=32, seed=0)
    rng = np.random.default_rng(0)
    mask = random_masks(rng, 200, (6,)).numpy().astype(np.int8)
    obs = rng.random((200, 6)).astype(np.float32)
    for deterministic in (True, False):
        actions, _ = model.predict(obs, action_mask=mask, deterministic=deterministic, rng=rng)
        assert mask[np.arange(200), actions].all()
    one, _ = model.predict(obs[0], action_mask=np.eye(6, dtype=np.int8)[4])
    assert one == 4
    free, _ = model.predict(obs)  # no mask given: every action legal
    assert free.shape == (200,)
    with pytest.raises(ConfigError, match="action_mask with shape"):
        model.predict(obs, action_mask=mask[:, :5])
    with pytest.raises(ConfigError, match="leaves no legal action"):
        model.predict(obs[0], action_mask=np.zeros(6, np.int8))

    written = model.export(tmp_path / "policy.pt", format="torchscript")
    assert written.check.mismatched == 0
    graph = torch.jit.load(str(tmp_path / "policy.pt"))
    names = [port["name"] for port in json.loads(written.metadata.read_text())["inputs"]]
    inputs = {"obs.observation": torch.from_numpy(obs), "obs.action_mask": torch.from_numpy(mask)}
    exported = graph(*[inputs[name] for name in names]).numpy()
    assert mask[np.arange(200), exported].all()
    np.testing.assert_array_equal(exported, model.predict(obs, action_mask=mask)[0])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env-kwargs", "bad=shape"], "has shape (5,), which is not allowed"),
        (["--env-kwargs", "bad=empty"], "it leaves no legal action"),
        (["--action-mask", "method"], "action_mask='method' is not allowed for this env: its masks come from 'info'"),
    ],
)
def test_bad_masks_are_one_line_errors(tmp_path, capsys, args, message):
    run = tmp_path / "run"
    code = main(
        ["train", "ppo", "distrl_maskenvs:MaskedChoiceEnv", "--total-steps", "512", *FAST, *args, "--run-dir", str(run)]
    )
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (run / "model").exists() and not (run / "checkpoints").exists()


def test_taxi_is_detected_from_info_and_off_turns_detection_off():
    env = gym.make("Taxi-v4")
    assert masks.detect(env) == "info"
    wrapped = masks.with_masks(env, "auto")
    obs, _ = wrapped.reset(seed=0)
    assert obs["action_mask"].dtype == np.int8 and obs["action_mask"].shape == (6,)
    assert masks.with_masks(gym.make("Taxi-v4"), "off").observation_space == gym.spaces.Discrete(500)
    assert masks.detect(gym.make("CartPole-v1")) == "off"
    assert masks.detect(method_env()) == "method"
    assert masks.detect(MaskedChoiceEnv(source="none")) == "off"
