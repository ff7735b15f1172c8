"""GRPO with a LoRA adapter (peft): only the adapter is trained, synced, checkpointed and exported.

Every model is a tiny random Llama from ``distrl_lm.make_model``, loaded through ``--model PATH`` as a real
one is.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from distrl.cli import main
from distrl.config import ConfigError, GRPOConfig, RunConfig
from distrl.data.groups import draw_groups
from distrl.nets.causal_lm import BaseModelReference, CausalLMPolicy
from distrl.nets.lora import LoraSettings, require_peft
from distrl.tasks.group import make_group_task
from distrl.training.group import GroupTrainer

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
from distrl_lm import DIGITS, make_model, write_reversal  # noqa: E402

RANK = 4
HIDDEN, LAYERS = 64, 2
# all-linear on the tiny Llama: per layer q, k, v, o (64 -> 64) and gate, up (64 -> 128), down (128 -> 64);
# an adapter on an (in -> out) layer holds A [rank, in] and B [out, rank]
ADAPTER_PARAMS = LAYERS * RANK * (4 * (64 + 64) + 2 * (64 + 128) + (128 + 64))
# on the tiny GPT-2: c_attn (64 -> 192), attn.c_proj (64 -> 64), c_fc (64 -> 256), mlp.c_proj (256 -> 64)
GPT2_ADAPTER_PARAMS = LAYERS * RANK * ((64 + 192) + (64 + 64) + (64 + 256) + (256 + 64))


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    return {
        "model": make_model(root / "model", chars=DIGITS, hidden=HIDDEN, layers=LAYERS),
        "gpt2": make_model(root / "gpt2", arch="gpt2", chars=DIGITS, hidden=HIDDEN, layers=LAYERS),
        "data": write_reversal(root / "reverse.jsonl", lines=64),
    }


def grpo_args(lm, run_dir, *flags, model=None):
    return [
        "train",
        "grpo",
        "--model",
        model or lm["model"],
        "--dataset",
        lm["data"],
        "--reward",
        "distrl_lm:reversal",
        "--reward-workers",
        "0",
        "--max-new-tokens",
        "5",
        "--learning-rate",
        "1e-2",
        "--group-size",
        "4",
        "--prompts-per-slice",
        "4",
        "--slices-per-step",
        "1",
        "--quiet",
        "--run-dir",
        str(run_dir),
        *flags,
    ]


def checkpoint_params(path):
    return {k: v for k, v in load_file(str(Path(path) / "tensors.safetensors")).items() if k.startswith("params/")}


def summary(run_dir):
    return json.loads((Path(run_dir) / "summary.json").read_text())


def lora_cfg(lm, **changes):
    fields = dict(
        model=lm["model"],
        dataset=lm["data"],
        rewards=("distrl_lm:reversal",),
        reward_workers=0,
        lora_rank=RANK,
        lora_alpha=8.0,
        group_size=4,
        prompts_per_slice=4,
        slices_per_step=1,
        max_new_tokens=5,
        learning_rate=1e-2,
    )
    return GRPOConfig(**{**fields, **changes})


def as_tensors(samples):
    return [torch.from_numpy(a) for a in (samples.prompt, samples.prompt_mask, samples.tokens, samples.mask)]


def base_weights(model):
    """The base model's weights under their transformers names, from a peft-wrapped model or a plain one."""
    if isinstance(model, peft.PeftModel):
        model = model.get_base_model()
    return {
        name.replace(".base_layer", ""): tensor for name, tensor in model.state_dict().items() if "lora_" not in name
    }


def test_grpo_steps_train_the_adapter_alone_and_the_reference_is_the_base_model(lm):
    cfg = lora_cfg(lm, learner_steps=3, beta=0.05)
    trainer = GroupTrainer(RunConfig(algo="grpo", env="lm", quiet=True), cfg, log=False)
    try:
        policy = trainer.policy
        adapter = {name: p for name, p in policy.model.named_parameters() if p.requires_grad}
        assert all("lora_" in name for name in adapter) and len(adapter) == 2 * 7 * LAYERS
        assert policy.params.size == sum(p.numel() for p in adapter.values()) == ADAPTER_PARAMS
        start, end = policy.params.data.data_ptr(), policy.params.data.data_ptr() + 4 * policy.params.size
        assert all(start <= p.data_ptr() < end for p in adapter.values())
        before = policy.params.data.clone()
        trainer.train()
        assert trainer.version == 3 and not torch.equal(before, policy.params.data)
        assert all(float(policy.params.view(name).abs().max()) > 0 for name in policy.params.shapes if "lora_B" in name)
        # the base weights are the loaded model's, bit for bit, and still float32
        loaded = transformers.AutoModelForCausalLM.from_pretrained(lm["model"], local_files_only=True)
        trained, original = base_weights(policy.model), base_weights(loaded)
        assert trained.keys() == original.keys()
        assert all(torch.equal(trained[k], original[k]) and trained[k].dtype == torch.float32 for k in original)
        # the reference is the learner's model with the adapter off: the base model's log-probs, not the learner's
        assert isinstance(trainer.reference, BaseModelReference)
        task = make_group_task("lm", cfg)
        samples = draw_groups(task, policy, np.arange(4), 2, seed=0, version=0)
        base = CausalLMPolicy(lm["model"], role="reference", max_new_tokens=5)
        with torch.no_grad():
            expected = base.token_log_probs(*as_tensors(samples))
            learner = policy.token_log_probs(*as_tensors(samples))
        assert torch.equal(trainer.reference.token_log_probs(*as_tensors(samples)), expected)
        assert not torch.allclose(learner, expected, atol=1e-3)
        s = trainer.summary()
        assert s["trainable_params"] == ADAPTER_PARAMS and s["weight_sync_bytes"] == 4 * ADAPTER_PARAMS
        assert s["total_params"] == sum(p.numel() for p in loaded.parameters()) + ADAPTER_PARAMS
    finally:
        trainer.close()


@pytest.mark.parametrize("arch, adapter_params", [("model", ADAPTER_PARAMS), ("gpt2", GPT2_ADAPTER_PARAMS)])
def test_a_generator_holds_the_same_adapter_and_draws_what_the_learner_computes(lm, arch, adapter_params):
    lora = LoraSettings(RANK, 8.0, dropout=0.2, seed=3)
    learner = CausalLMPolicy(lm[arch], max_new_tokens=5, lora=lora)
    generator = CausalLMPolicy(lm[arch], role="generator", max_new_tokens=5, lora=lora)
    # the adapter starts from the seed alone: equal in every process, other with another seed
    assert generator.params.size == learner.params.size == adapter_params
    assert torch.equal(generator.params.data, learner.params.data)
    other = CausalLMPolicy(lm[arch], role="generator", lora=LoraSettings(RANK, 8.0, seed=4))
    assert not torch.equal(other.params.data, learner.params.data)
    with torch.no_grad():  # B starts at zero: move it, or the adapter changes nothing
        learner.params.data.add_(0.05 * torch.randn(learner.params.size, generator=torch.Generator().manual_seed(0)))
    weights = learner.params.flat()
    assert weights.shape == (adapter_params,)
    generator.params.load_flat(weights)
    task = make_group_task("lm", lora_cfg(lm, model=lm[arch]))
    drawn = draw_groups(task, generator, np.arange(8), 3, seed=5, version=1)
    assert drawn.texts == draw_groups(task, learner, np.arange(8), 3, seed=5, version=1).texts
    mask = torch.from_numpy(drawn.mask)
    with torch.no_grad():  # no dropout outside the learner's gradient pass
        recomputed = learner.token_log_probs(*as_tensors(drawn))
    assert torch.allclose(recomputed[mask], torch.from_numpy(drawn.log_probs)[mask], atol=2e-5)
    # the learner's pass drops adapter inputs, with masks keyed by the seed and the tokens: the same twice
    with_dropout = learner.token_log_probs(*as_tensors(drawn))
    assert not torch.allclose(with_dropout[mask], recomputed[mask], atol=1e-3)
    assert torch.equal(with_dropout, learner.token_log_probs(*as_tensors(drawn)))
    assert all(not m.training for m in learner.model.modules())  # back in eval mode after the pass


def test_a_resumed_lora_run_equals_the_uninterrupted_one_and_exports_the_adapter_and_the_merged_model(lm, tmp_path):
    run_dir, model = tmp_path / "run", tmp_path / "model"
    shutil.copytree(lm["model"], model)  # its weights are swapped at the end
    flags = ("--lora-rank", str(RANK), "--lora-alpha", "8", "--lora-dropout", "0.1", "--beta", "0.05")
    flags += ("--lora-merge", "--learner-steps", "4", "--checkpoint-every", "2")
    assert main(grpo_args(lm, run_dir, *flags, model=str(model))) == 0
    whole = checkpoint_params(run_dir / "model")
    assert len(whole) == 2 * 7 * LAYERS and all("lora_" in k for k in whole)
    assert sum(v.numel() for v in whole.values()) == ADAPTER_PARAMS
    step2 = run_dir / "checkpoints" / "step-000000000002"
    optim = {k: v for k, v in load_file(str(step2 / "tensors.safetensors")).items() if k.startswith("optim/")}
    assert sum(v.numel() for k, v in optim.items() if v.numel() > 1) == 2 * ADAPTER_PARAMS  # Adam's two moments
    shutil.rmtree(run_dir / "model")
    shutil.rmtree(run_dir / "pretrained")
    assert main(["train", "grpo", "--resume", str(step2), "--reward", "distrl_lm:reversal", "--quiet"]) == 0
    resumed = checkpoint_params(run_dir / "model")
    assert resumed.keys() == whole.keys() and all(torch.equal(whole[k], resumed[k]) for k in whole)

    # RUN/pretrained: the adapter in peft's format, which PeftModel loads on the base model
    pretrained = run_dir / "pretrained"
    assert (pretrained / "adapter_config.json").is_file() and (pretrained / "adapter_model.safetensors").is_file()
    assert not (pretrained / "model.safetensors").exists()
    learner = CausalLMPolicy(str(model), lora=LoraSettings(RANK, 8.0, dropout=0.1))
    learner.params.load_state_dict({k.removeprefix("params/"): v for k, v in resumed.items()})
    base = transformers.AutoModelForCausalLM.from_pretrained(str(model), local_files_only=True)
    adapted = peft.PeftModel.from_pretrained(base, str(pretrained)).eval()
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(pretrained / "merged"), local_files_only=True)
    ids = torch.tensor([[1, 5, 6, 7, 14, 9, 8], [1, 11, 4, 4, 14, 12, 5]])
    with torch.no_grad():
        expected = learner.model(input_ids=ids).logits.log_softmax(-1)
        assert torch.allclose(adapted(input_ids=ids).logits.log_softmax(-1), expected, atol=1e-6)
        assert torch.allclose(merged(input_ids=ids).logits.log_softmax(-1), expected, atol=1e-5)
        with adapted.disable_adapter():  # the adapter is what makes the difference
            assert not torch.allclose(adapted(input_ids=ids).logits.log_softmax(-1), expected, atol=1e-3)
    assert transformers.AutoTokenizer.from_pretrained(str(pretrained / "merged")).decode([5, 6]) == "12"

    # the checkpoint holds the adapter alone: on other base weights (at the same path) it refuses to go on
    state = json.loads((step2 / "state.json").read_text())
    assert state["lora"]["rank"] == RANK and len(state["base_checksum"]) == 16
    other = make_model(tmp_path / "other", chars=DIGITS, seed=7, hidden=HIDDEN, layers=LAYERS)
    shutil.copy(Path(other) / "model.safetensors", model / "model.safetensors")
    result = subprocess.run(
        [sys.executable, "-m", "distrl", "train", "grpo", "--resume", str(step2), "--reward", "distrl_lm:reversal"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and "holds a LoRA adapter trained on other base weights than model=" in err[0], err


@pytest.mark.multiprocess
@pytest.mark.heavy
def test_lora_pipeline_and_ddp_move_the_adapter_alone_and_reproduce_single(lm, tmp_path, ray_local):
    flags = ("--lora-rank", str(RANK), "--lora-alpha", "8", "--learner-steps", "2", "--slices-per-call", "1")

    def run(name, *more):  # in this process: the pipeline on the session's Ray instance, ddp's ranks launched
        assert main(grpo_args(lm, tmp_path / name, *flags, *more)) == 0
        return checkpoint_params(tmp_path / name / "model"), summary(tmp_path / name)

    assert main(grpo_args(lm, tmp_path / "single", *flags)) == 0
    single = checkpoint_params(tmp_path / "single" / "model")
    pipeline, s = run("pipeline", "--strategy", "pipeline", "--workers", "1", "--queue-size", "1")
    assert s["weight_sync_bytes"] == 4 * ADAPTER_PARAMS and s["trainable_params"] == ADAPTER_PARAMS
    # one generator one request ahead: one vector per version it drew with (versions 0 and 1), the adapter alone
    assert s["weight_sync_bytes_total"] == 2 * 4 * ADAPTER_PARAMS
    assert max(float((single[k] - pipeline[k]).abs().max()) for k in single) < 1e-6
    # two ranks with half the prompts each: the start-up broadcast and the gradient sum carry the adapter alone
    ddp, s = run("ddp", "--prompts-per-slice", "2", "--strategy", "ddp", "--workers", "2")
    assert len(set(s["param_checksums"])) == 1 and s["completions"] == summary(tmp_path / "single")["completions"]
    # Adam's first steps move every weight by about the learning rate (1e-2) whatever its gradient's size: the
    # ranks' other summation order shows in the small gradients of A (zero at step 1, B starting at zero)
    assert max(float(single[k].abs().max()) for k in single if "lora_B" in k) > 1e-2
    assert max(float((single[k] - ddp[k]).abs().max()) for k in single) < 2e-4


def test_lora_options_that_mean_nothing_or_match_nothing_are_refused_before_the_run(lm, tmp_path, capsys):
    cases = [
        (["--lora-merge"], "lora_merge=True is not allowed with lora_rank=0 (full fine-tuning)"),
        (["--lora-alpha", "16"], "lora_alpha=16.0 is not allowed with lora_rank=0"),
        (["--lora-target-modules", "q_proj"], "lora_target_modules=('q_proj',) is not allowed with lora_rank=0"),
        (
            ["--lora-rank", "4", "--lora-target-modules", "q_proj", "qproj", "mlp.nope"],
            f"lora_target_modules=('qproj', 'mlp.nope') is not allowed: no module of model={lm['model']!r} has that "
            "name; its linear layers are down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj",
        ),
        (["--lora-rank", "4", "--strategy", "ddp", "--workers", "2", "--lora-target-modules", "x"], "('x',)"),
    ]
    for flags, message in cases:
        run_dir = tmp_path / "run"
        assert main(grpo_args(lm, run_dir, *flags)) == 2, flags
        err = capsys.readouterr().err.strip()
        assert err.startswith("distrl: error: ") and message in err and "\n" not in err, err
        assert not run_dir.exists()
    assert main(["train", "grpo", "toy", "--lora-rank", "4", "--run-dir", str(tmp_path / "toy")]) == 2
    assert "lora_rank=4 is not allowed without --model" in capsys.readouterr().err
    # a target that names a module peft cannot adapt: one line from the policy itself
    with pytest.raises(ConfigError, match=r"lora_target_modules=\('layers',\) is not allowed for model=") as caught:
        CausalLMPolicy(lm["model"], lora=LoraSettings(RANK, 8.0, target_modules=("layers",)))
    assert "\n" not in str(caught.value)


def test_without_peft_lora_is_a_one_line_error_naming_the_extra(lm, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft raises ImportError
    with pytest.raises(ConfigError, match=r"^lora_rank=4: LoRA needs peft \(pip install 'distrl\[lm\]'\)$"):
        require_peft("lora_rank=4")
    with pytest.raises(ConfigError, match="LoRA needs peft"):
        CausalLMPolicy(lm["model"], lora=LoraSettings(RANK, 8.0))
    with pytest.raises(ConfigError, match="LoRA needs peft"):
        GroupTrainer.check_env(RunConfig(algo="grpo", env="lm"), lora_cfg(lm))
    CausalLMPolicy(lm["model"])  # full fine-tuning needs no peft
