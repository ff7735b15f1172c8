import json
import os
import subprocess
import sys

import pytest

from distrl.cli import main
from distrl.run import checkpoint

FAST = ["--total-steps", "2048", "--n-envs", "8", "--n-steps", "16", "--batch-size", "64", "--n-epochs", "2", "--quiet"]


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "distrl", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "ppo", "CartPol-v1"], "did you mean CartPole-v1"),
        (["train", "xyz", "CartPole-v1"], "algo='xyz' is not known"),
        (["train", "ppo", "CartPole-v1", "--n-steps", "0"], "n_steps=0 is not allowed: must be > 0"),
        (["train", "ppo", "CartPole-v1", "--batch-size", "100"], "must be a divisor of n_envs * n_steps"),
        (["train", "ppo", "CartPole-v1", "--total-steps", "-5"], "total_steps=-5"),
        (["train", "ppo", "CartPole-v1", "--preset", "nope"], "preset='nope' is not a ppo preset"),
        (["train", "ppo", "distrl_testenvs:ContinuousCountEnv", "--vec", "native"], "vec='native' is not available"),
        (["train", "ppo", "Blackjack-v1"], "observation space Tuple"),
        (["train", "ppo"], "ENV is missing"),
        (["eval", "/no/such/run"], "does not exist"),
        (["train", "sac", "CartPole-v1"], "has a Discrete action space; sac needs Box"),
        (
            ["train", "sac", "Pendulum-v1", "--buffer-size", "100"],
            "buffer_size=100 is not allowed: must be >= batch_size",
        ),
        (["train", "sac", "Pendulum-v1", "--ent-coef", "lots"], "ent_coef='lots'"),
        (
            ["train", "sac", "Pendulum-v1", "--buffer-size", str(10**11)],
            "buffer_size=100000000000 is not allowed: must be at most",
        ),
        (
            ["train", "ppo", "distrl_spaceenvs:QuadrantEnv", "--encoder", "nature"],
            "encoder='nature' does not fit a 10x10 image",
        ),
        (["train", "ppo", "distrl_spaceenvs:QuadrantEnv", "--normalize-obs"], "normalize_obs=True is not allowed"),
        (["train", "ppo", "os:system"], "an entry point must be a gymnasium.Env subclass or a function returning"),
        (["train", "ppo", "distrl_testenvs:returns_none"], "returned a NoneType, not a gymnasium.Env"),
        (
            ["train", "ppo", "CartPole-v1", "--env-kwargs", "fast"],
            "env_kwargs='fast' is not allowed: must be key=value",
        ),
        (
            ["train", "ppo", "CartPole-v1", "--env-kwargs", "speed=2"],
            "env_kwargs=speed=2 is not accepted by CartPole-v1",
        ),
        (
            ["train", "ppo", "CartPole-v1", "--wrapper", "distrl_testenvs:broken_wrapper"],
            "'distrl_testenvs:broken_wrapper' returned",
        ),
        (["train", "ppo", "CartPole-v1", "--policy", "nets"], "policy='nets' is not allowed"),
        # flags tyro cannot parse: its box of lines read back as one
        (
            ["train", "ppo", "CartPole-v1", "--net-arch", "256,256"],
            "['256,256']; the flag takes --net-arch [INT [INT ...]]",
        ),
        (
            ["train", "ppo", "CartPole-v1", "--n-step", "5"],
            "Unrecognized options: --n-step, 5; did you mean --n-steps INT?",
        ),
        (["train", "ppo", "CartPole-v1", "--strategy", "foo"], "invalid choice 'foo' for argument '--strategy'"),
        # the real reason first: decoupled does not train SAC, whatever --workers says
        (
            ["train", "sac", "Pendulum-v1", "--strategy", "decoupled"],
            "algo='sac' is not available with --strategy decoupled",
        ),
        (["train", "--resume", "/no/such/run"], "does not exist"),
        (["tune", "ppo", "CartPole-v1", "--trials", "x"], "'x'; the flag takes --trials INT (flags: distrl tune ppo"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, args, message):
    code = main([*args, "--run-dir", str(tmp_path / "run")] if args[0] == "train" and len(args) > 2 else args)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_subprocess_error_has_no_traceback_unless_debug(tmp_path):
    result = run_cli("train", "ppo", "CartPole-v1", "--n-envs", "0")
    assert result.returncode == 2
    assert result.stderr.strip() == "distrl: error: n_envs=0 is not allowed: must be > 0"
    debug = run_cli("train", "ppo", "CartPole-v1", "--n-envs", "0", "--debug")
    assert debug.returncode == 2 and "Traceback" in debug.stderr


@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])  # tyro draws its boxes in either
def test_a_flag_that_does_not_parse_is_one_line_however_the_terminal_draws_boxes(encoding):
    result = subprocess.run(
        [sys.executable, "-m", "distrl", "train", "ppo", "CartPole-v1", "--n-envs", "four"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONIOENCODING": encoding, "COLUMNS": "60"},
    )
    assert result.returncode == 2
    assert result.stderr == (
        "distrl: error: Error parsing --n-envs: invalid literal for int() with base 10: 'four'; "
        "the flag takes --n-envs INT (flags: distrl train ppo CartPole-v1 --help)\n"
    )


def test_corrupt_checkpoint_in_eval_is_a_clear_error(tmp_path, capsys):
    path = checkpoint.save(tmp_path / "ck", {}, {"steps": 1})
    (path / checkpoint.TENSORS).write_bytes(b"garbage")
    assert main(["eval", str(path)]) == 2
    assert "truncated or corrupt" in capsys.readouterr().err


def test_train_writes_run_dir_and_eval_reads_it(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["train", "ppo", "cartpole", *FAST, "--run-dir", str(run_dir)]) == 0
    config = json.loads((run_dir / "config.json").read_text())
    assert config["run"]["env"] == "CartPole-v1" and config["ppo"]["n_steps"] == 16
    lines = (run_dir / "monitor.csv").read_text().splitlines()
    header = json.loads(lines[0][1:])
    assert header["env_id"] == "CartPole-v1" and lines[1] == "r,l,t" and len(lines) > 3
    r, l, t = lines[2].split(",")
    assert float(r) == int(l) > 0  # CartPole pays 1 per step
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["total_steps"] == 2048 and summary["sps"] > 0 and summary["distrl_version"]
    assert any(p.name.startswith("events.out.tfevents") for p in run_dir.iterdir())
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip())
    assert out["episodes"] == 3 and out["mean_return"] == pytest.approx(summary["final_eval_mean_return"], abs=1e9)
    assert main(["train", "ppo", "cartpole", *FAST, "--run-dir", str(run_dir)]) == 2  # refuses to overwrite


def test_resume_from_cli_continues_to_new_total(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "train",
        "ppo",
        "cartpole",
        "--n-envs",
        "4",
        "--n-steps",
        "16",
        "--batch-size",
        "32",
        "--n-epochs",
        "1",
        "--quiet",
    ]
    assert main([*args, "--total-steps", "256", "--run-dir", str(run_dir)]) == 0
    assert main([*args, "--resume", str(run_dir), "--total-steps", "512"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["total_steps"] == 512
    assert sum(1 for _ in open(run_dir / "monitor.csv")) > 3


def test_resume_from_an_earlier_checkpoint_continues_its_run(tmp_path):
    args = [
        "train",
        "ppo",
        "cartpole",
        "--n-envs",
        "4",
        "--n-steps",
        "16",
        "--batch-size",
        "32",
        "--n-epochs",
        "1",
        "--quiet",
        "--total-steps",
        "512",
        "--checkpoint-every",
        "256",
    ]
    assert main([*args, "--run-dir", str(tmp_path / "full")]) == 0
    assert main([*args, "--run-dir", str(tmp_path / "run")]) == 0
    older = tmp_path / "run" / "checkpoints" / f"step-{256:012d}"
    assert main([*args, "--resume", str(older)]) == 0
    assert sorted(p.name for p in older.iterdir()) == ["state.json", "tensors.safetensors"]  # nothing written into it

    def episodes(run_dir):
        return [line.split(",")[:2] for line in (run_dir / "monitor.csv").read_text().splitlines()[2:]]

    # steps 256-512 were played twice; the run logs them once, as the uninterrupted run did
    assert episodes(tmp_path / "run") == episodes(tmp_path / "full")
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["episodes"] == len(episodes(tmp_path / "full"))


def test_sac_trains_saves_its_replay_and_resumes(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = [
        "train",
        "sac",
        "Pendulum-v1",
        "--learning-starts",
        "50",
        "--batch-size",
        "32",
        "--net-arch",
        "32",
        "32",
        "--save-replay",
        "--quiet",
    ]
    assert main([*args, "--total-steps", "300", "--checkpoint-every", "200", "--run-dir", str(run_dir)]) == 0
    assert (run_dir / "checkpoints" / f"step-{200:012d}" / "replay.safetensors").exists()
    assert (run_dir / "model" / "replay.safetensors").exists()
    assert main([*args, "--resume", str(run_dir), "--total-steps", "400"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["algo"] == "sac" and summary["total_steps"] == 400
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["episodes"] == 2 and -2000 < out["mean_return"] < 0


def test_run_dir_whose_only_checkpoint_is_truncated_says_so(tmp_path, capsys):
    path = checkpoint.save(tmp_path / "run" / "model", {"a": __import__("torch").zeros(3)}, {"steps": 5})
    (path / checkpoint.STATE).write_text('{"format": "distrl-che')
    assert main(["eval", str(tmp_path / "run")]) == 2
    assert "truncated or corrupt" in capsys.readouterr().err


def test_custom_env_with_kwargs_and_wrappers_evaluates_in_a_fresh_process(tmp_path):
    run_dir = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "ppo",
                "distrl_testenvs:GoRight",
                *FAST,
                "--total-steps",
                "512",
                "--env-kwargs",
                "size=3",
                "--wrapper",
                "distrl_testenvs:double_reward",
                "--wrapper",
                "distrl_testenvs:add_one_reward",
                "--run-dir",
                str(run_dir),
            ]
        )
        == 0
    )
    run = json.loads((run_dir / "config.json").read_text())["run"]
    assert run["env"] == "distrl_testenvs:GoRight" and run["env_kwargs"] == ["size=3"]
    assert run["wrappers"] == ["distrl_testenvs:double_reward", "distrl_testenvs:add_one_reward"]
    assert json.loads((run_dir / "model" / "state.json").read_text())["env_id"] == "distrl_testenvs:GoRight"
    # wrapped reward: 2 * (-0.1) + 1 = 0.8 per move that does not reach the end, 2 * 1 + 1 = 3 at the end
    code = (
        f"from distrl import PPO; m = PPO.load({str(run_dir)!r}, trust_code=True); env = m._trainer.env; "
        "print(env.env_id, env.reset(seed=0).shape, env.step(__import__('numpy').ones(8, int)).reward[0])"
    )
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.split() == ["custom/GoRight-v0", "(8,", "1)", "0.8"]
    result = run_cli("eval", str(run_dir), "--episodes", "2", "--json", "--stochastic", "--trust-code")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["episodes"] == 2


def test_a_run_saved_with_a_custom_id_takes_the_entry_point_from_the_command(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert (
        main(["train", "ppo", "distrl_testenvs:GoRight", *FAST, "--total-steps", "256", "--run-dir", str(run_dir)]) == 0
    )
    for path in [run_dir / "config.json", run_dir / "model" / "state.json"]:  # as distrl wrote them before
        path.write_text(path.read_text().replace('"distrl_testenvs:GoRight"', '"custom/Gone-v0"'))
    capsys.readouterr()
    assert main(["eval", str(run_dir)]) == 2
    assert "name it, e.g. --env mypkg.envs:Gone" in capsys.readouterr().err
    assert main(["eval", str(run_dir), "--env", "distrl_testenvs:GoRight", "--episodes", "2"]) == 0
    assert main(["train", "ppo", "distrl_testenvs:GoRight", "--resume", str(run_dir), "--total-steps", "512"]) == 2
    assert "differs from the resumed run's env 'custom/Gone-v0'" in capsys.readouterr().err
    for path in [run_dir / "config.json", run_dir / "model" / "state.json"]:
        path.write_text(path.read_text().replace('"custom/Gone-v0"', '"custom/GoRight-v0"'))
    assert (
        main(["train", "ppo", "distrl_testenvs:GoRight", "--resume", str(run_dir), "--total-steps", "512", "--quiet"])
        == 0
    )
    assert json.loads((run_dir / "config.json").read_text())["run"]["env"] == "distrl_testenvs:GoRight"


X86 = "processor : 0\nflags : fpu sse2 avx avx2 fma {}\n"
ARM = "processor : 0\nFeatures : fp asimd sve {}\n"


@pytest.mark.parametrize(
    "cpuinfo, native",
    [
        (X86.format(""), False),
        (X86.format("avx512f avx512_bf16"), True),
        (X86.format("amx_tile amx_bf16"), True),
        (X86.format("avx512bw avx512vl"), False),  # AVX-512 without its BF16 extension converts every operand
        (ARM.format(""), False),
        (ARM.format("bf16 i8mm"), True),
        ("", None),
    ],
    ids=["avx2", "avx512-bf16", "amx", "avx512-core", "arm", "arm-bf16", "unknown"],
)
def test_native_bf16_is_read_from_the_cpu_flags(cpuinfo, native):
    from distrl.training.precision import cpu_has_native_bf16

    assert cpu_has_native_bf16(cpuinfo) is native


def test_the_products_timed_at_a_bf16_start_leave_the_runs_random_streams_alone():
    import torch

    from distrl.training.precision import product_seconds

    torch.manual_seed(3)
    before = torch.get_rng_state()
    fp32, bf16 = product_seconds(rounds=3, products=2)
    assert torch.equal(torch.get_rng_state(), before)
    assert 0 < fp32 < 1 and 0 < bf16 < 1


def test_bf16_on_a_cpu_that_multiplies_slower_in_it_is_noted_once(tmp_path, capsys, monkeypatch):
    from distrl.config import RunConfig, StrategyConfig
    from distrl.training import precision

    bf16 = RunConfig(precision="bf16", device="cpu")
    monkeypatch.setattr(precision, "product_seconds", lambda: (250e-6, 776e-6))
    note = precision.bf16_slow_note(bf16, StrategyConfig())
    assert note.startswith("precision=bf16: on this CPU a 256x256 product took 776 us in bfloat16 against 250 us")
    assert "(3.1x)" in note
    for bf16_time in (125e-6, 1.2 * 250e-6):  # faster, and slower by no more than timing noise
        monkeypatch.setattr(precision, "product_seconds", lambda t=bf16_time: (250e-6, t))
        assert precision.bf16_slow_note(bf16, StrategyConfig()) is None

    def not_timed():
        raise AssertionError("an fp32 run times nothing")

    monkeypatch.setattr(precision, "product_seconds", not_timed)
    assert precision.bf16_slow_note(bf16.replace(precision="fp32"), StrategyConfig()) is None

    monkeypatch.setattr(precision, "product_seconds", lambda: (250e-6, 776e-6))
    loud = [flag for flag in FAST if flag != "--quiet"]
    assert main(["train", "ppo", "cartpole", *loud, "--precision", "bf16", "--run-dir", str(tmp_path / "a")]) == 0
    assert capsys.readouterr().err.count("precision=bf16: on this CPU a 256x256 product took 776 us") == 1
    events = json.loads((tmp_path / "a" / "summary.json").read_text())["events"]
    assert sum("precision=bf16: on this CPU" in event for event in events) == 1
    monkeypatch.setattr(precision, "product_seconds", lambda: (250e-6, 125e-6))
    assert main(["train", "ppo", "cartpole", *loud, "--precision", "bf16", "--run-dir", str(tmp_path / "b")]) == 0
    assert "bfloat16" not in capsys.readouterr().err
    assert not any("bfloat16" in event for event in json.loads((tmp_path / "b" / "summary.json").read_text())["events"])


def test_a_flags_help_text_flows_as_one_paragraph(capsys, monkeypatch):
    # The --trust-code docstring spans three source lines; --help joins them (see cli._flowing_help and its pin
    # of tyro), so its text runs on past the source's line end instead of breaking there.
    monkeypatch.setenv("COLUMNS", "120")
    with pytest.raises(SystemExit) as stop:
        main(["train", "ppo", "CartPole-v1", "--help"])
    assert stop.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert any("factory) to be imported and run" in line for line in lines)


PARSE_ONLY = """
import json, sys
from distrl.cli import main
codes = []
for argv in json.loads(sys.argv[1]):
    try:
        codes.append(main(argv))
    except SystemExit as stop:
        codes.append(stop.code)
print(json.dumps([codes, [m for m in ("torch", "gymnasium", "ray", "transformers") if m in sys.modules]]))
"""


def test_parsing_and_config_validation_import_no_torch_gymnasium_ray_or_transformers():
    # help, the version and every one-line refusal of a command, flag or value answer before any framework loads
    # (a fresh process: this one imported torch long ago)
    cases = [
        ["--help"],
        ["--version"],
        ["train", "--help"],
        ["train", "ppo", "--help"],
        ["train", "sac", "Pendulum-v1", "--help"],
        ["train", "ppo", "CartPole-v1", "--n-stepz", "64"],
        ["train", "ppo", "cartpole", "--n-steps", "0"],
        ["train", "ppo", "CartPole-v1", "--strategy", "pipelin"],
        ["train", "xyz", "CartPole-v1"],
        ["train", "grpo", "bandid"],
        ["train", "sac", "Pendulum-v1", "--strategy", "decoupled"],
        ["train", "dqn", "acrobot", "--help"],  # an env without a preset: its fallback is read as the run starts
        ["train", "dqn", "mountaincar", "--learning-ratez", "1"],
        ["trian"],
    ]
    out = subprocess.run(
        [sys.executable, "-c", PARSE_ONLY, json.dumps(cases)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    codes, loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert codes == [0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 0, 2, 2]
    assert loaded == []


def test_top_level_help_sets_every_description_in_one_column():
    # each command's description, and each line that carries one on, starts where the first one does
    from distrl.cli import usage

    commands, version = usage().split("\n\n")[1:3]
    lines = [*commands.splitlines(), *version.splitlines()]
    column = lines[0].index("train an agent")
    assert len(lines) > 10
    for line in lines:
        assert line[column - 1] == " " and line[column] != " ", line
