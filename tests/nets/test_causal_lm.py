"""A transformers causal LM as a group policy: loading, sampling with the KV cache, log-probabilities, export."""

import json

import numpy as np
import pytest
import torch

from distrl.config import ConfigError, GRPOConfig, RunConfig
from distrl.data.groups import draw_groups
from distrl.nets.causal_lm import CausalLMPolicy
from distrl.tasks.group import make_group_task
from distrl.training.group import GroupTrainer

transformers = pytest.importorskip("transformers")
from distrl_lm import make_model, write_reversal  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {
        arch: make_model(root / arch, arch=arch, seed=1, chat_template=arch == "gpt2") for arch in ("llama", "gpt2")
    }


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "prompts.jsonl"
    lines = ["1=", "12345=", "987=", "4=", "000000=", "31=", "7=", "55555="]  # left padding of every width
    path.write_text("".join(json.dumps({"prompt": p, "answer": p[:-1][::-1]}) + "\n" for p in lines))
    return str(path)


def test_a_missing_or_foreign_model_directory_is_a_one_line_error(tmp_path):
    with pytest.raises(ConfigError, match="model='' is not allowed"):
        CausalLMPolicy("")
    with pytest.raises(ConfigError, match="is not a directory: must be a local directory"):
        CausalLMPolicy(str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="has no config.json: must be a directory written by save_pretrained"):
        CausalLMPolicy(str(tmp_path))
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(ConfigError, match="cannot be loaded") as caught:
        CausalLMPolicy(str(tmp_path))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_behaviour_log_probs_from_the_kv_cache_are_the_learners_and_do_not_depend_on_the_split(
    models, prompts_file, arch
):
    cfg = GRPOConfig(model=models[arch], dataset=prompts_file, rewards=("exact_match",), max_new_tokens=12)
    task = make_group_task("lm", cfg)
    policy = CausalLMPolicy(models[arch], max_new_tokens=12)
    positions = np.arange(8)
    whole = draw_groups(task, policy, positions, group_size=3, seed=5, version=0)
    # prompts of 2 to 7 tokens are left-padded: the cached pass and the learner's full pass must agree
    learner = policy.token_log_probs(
        *[torch.from_numpy(a) for a in (whole.prompt, whole.prompt_mask, whole.tokens, whole.mask)]
    )
    mask = torch.from_numpy(whole.mask)
    assert torch.allclose(learner.detach()[mask], torch.from_numpy(whole.log_probs)[mask], atol=2e-5)
    assert (whole.log_probs[~whole.mask] == 0).all()
    halves = [draw_groups(task, policy, part, 3, seed=5, version=0) for part in (positions[:3], positions[3:])]
    assert [t for h in halves for t in h.texts] == list(whole.texts)  # position-keyed: the split does not matter
    # a completion ends with its first EOS (kept, masked in) and nothing after it is
    for tokens, valid in zip(whole.tokens, whole.mask):
        eos = np.flatnonzero(tokens[valid] == policy.tokenizer.eos_token_id)
        assert len(eos) == 0 or eos[0] == valid.sum() - 1
        assert valid[: valid.sum()].all() and not valid[valid.sum() :].any()
    assert 0 < whole.mask.sum(1).min() and whole.mask.sum(1).max() <= 12
    different = draw_groups(task, policy, positions, 3, seed=6, version=0)
    assert different.texts != whole.texts


def test_a_stop_string_ends_a_completion_and_stays_in_it(models, prompts_file):
    cfg = GRPOConfig(model=models["llama"], dataset=prompts_file, rewards=("exact_match",))
    task = make_group_task("lm", cfg)
    policy = CausalLMPolicy(models["llama"], max_new_tokens=40, stop=("5", "ab"))
    samples = draw_groups(task, policy, np.arange(8), 4, seed=0, version=0)
    stopped = 0
    for text, length in zip(samples.texts, samples.mask.sum(1)):
        first = min((text.find(s) + len(s) for s in ("5", "ab") if s in text), default=None)
        if first is not None:
            assert first == len(text), text  # cut right after the first stop string
            stopped += 1
        else:
            assert length == 40 or text == "" or length < 40  # ended by EOS or the length limit
    assert stopped > 0


def test_chat_prompts_use_the_tokenizers_template(models, tmp_path):
    chat = CausalLMPolicy(models["gpt2"], chat_template=True)
    assert chat.prompts.render("12=") == ("u:12=a:", True)
    assert chat.prompts.render([{"role": "system", "content": "s"}, {"role": "user", "content": "x"}]) == (
        "s:su:xa:",
        True,
    )
    plain = CausalLMPolicy(models["llama"])
    assert plain.prompts.render("12=") == ("12=", False)
    with pytest.raises(ConfigError, match="its tokenizer has no chat template"):
        plain.prompts.render([{"role": "user", "content": "x"}])


def test_save_pretrained_gives_back_the_trained_weights(models, tmp_path):
    policy = CausalLMPolicy(models["llama"])
    with torch.no_grad():
        policy.params.data.add_(0.01 * torch.randn(policy.params.size, generator=torch.Generator().manual_seed(0)))
    policy.save_pretrained(tmp_path / "out")
    again = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), local_files_only=True)
    ids = torch.tensor([[5, 6, 7, 14]])
    with torch.no_grad():
        assert torch.allclose(policy.model(ids).logits, again(ids).logits, atol=1e-6)
    assert again.get_output_embeddings().weight.data_ptr() == again.get_input_embeddings().weight.data_ptr()
    assert transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out")).decode([5, 6]) == "12"


def test_parameters_are_views_of_one_buffer_and_gradients_land_in_it(models):
    policy = CausalLMPolicy(models["llama"])
    start, end = policy.params.data.data_ptr(), policy.params.data.data_ptr() + 4 * policy.params.size
    assert all(start <= p.data_ptr() < end for p in policy.model.parameters())
    generator = CausalLMPolicy(models["llama"], role="generator")
    assert not generator.params.param.requires_grad and generator.params.param.grad is None
    reference = CausalLMPolicy(models["llama"], role="reference")
    assert reference.params is None and not any(p.requires_grad for p in reference.model.parameters())


def test_prompts_over_max_prompt_tokens_are_refused_before_the_run(models, tmp_path):
    data = write_reversal(tmp_path / "d.jsonl", lines=20, digits=3)
    cfg = GRPOConfig(model=models["llama"], dataset=data, rewards=("exact_match",), max_prompt_tokens=3)
    with pytest.raises(ConfigError, match=r"d.jsonl' line 1: the prompt has 4 tokens, over max_prompt_tokens=3"):
        GroupTrainer.check_env(RunConfig(algo="grpo", env="lm"), cfg)


def test_bf16_runs_the_model_in_bfloat16_and_keeps_float32_weights_and_gradients(models, prompts_file):
    cfg = GRPOConfig(model=models["llama"], dataset=prompts_file, rewards=("exact_match",))
    task = make_group_task("lm", cfg)
    policy = CausalLMPolicy(models["llama"], bf16=True, max_new_tokens=6)
    seen = []
    policy.model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    samples = draw_groups(task, policy, np.arange(4), 2, seed=0, version=0)
    learner = policy.token_log_probs(
        *[torch.from_numpy(a) for a in (samples.prompt, samples.prompt_mask, samples.tokens, samples.mask)]
    )
    assert set(seen) == {torch.bfloat16} and learner.dtype == torch.float32
    mask = torch.from_numpy(samples.mask)
    assert torch.allclose(learner.detach()[mask], torch.from_numpy(samples.log_probs)[mask], atol=0.1)
    learner[mask].sum().backward()
    assert policy.params.data.dtype == policy.params.grad.dtype == torch.float32 and policy.params.grad.abs().sum() > 0
