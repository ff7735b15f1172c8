"""distrl tune --scheduler pbt: an exploit copies a member exactly, a population on CartPole exploits by
truncation selection and records its lineage, the best member's schedule replays to its very state, a member
that crashes goes on from its checkpoint, lineage files give schedules and plots, and bad flags are one line."""

import contextlib
import dataclasses
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("optuna")

from distrl.cli import main  # noqa: E402
from distrl.run import checkpoint  # noqa: E402
from distrl.tune.lineage import Segment, final_returns, read_lineage, schedule  # noqa: E402
from distrl.tune.member import MemberState, PBTSpec, advance, at_round, build_trainer  # noqa: E402

LR_RANGE = {"type": "float", "low": 1e-6, "high": 3e-3, "log": True}
BUDGET, INTERVAL = 8192, 2048  # the CartPole preset's rollout is 32 envs x 16 steps: 4 rollouts an interval


def _pbt(tmp_path: Path, *flags: str, population: int = 4, budget: int = BUDGET) -> list[str]:
    space = tmp_path / "space.json"
    space.write_text(json.dumps({"learning_rate": LR_RANGE}))
    return [
        "tune",
        "ppo",
        "CartPole-v1",
        "--scheduler",
        "pbt",
        "--population",
        str(population),
        "--parallel",
        "2",
        "--budget-steps",
        str(budget),
        "--perturbation-interval",
        str(INTERVAL),
        "--space",
        str(space),
        "--no-default-space",
        "--eval-episodes",
        "3",
        "--study-dir",
        str(tmp_path / "study"),
        *flags,
    ]


def _run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


# ---- the exploit, at function level (no Ray) ----


def test_an_exploit_copies_weights_optimizer_state_and_statistics_exactly(tmp_path):
    """B, built with a new learning rate, loads A's checkpoint as a member does: its next interval equals A's own
    had A gone on with the new learning rate, differs from going on with the old one, and B's logs stay its own."""
    spec = PBTSpec(
        algo="ppo",
        env="CartPole-v1",
        env_id="CartPole-v1",
        base={"n_envs": 4, "n_steps": 32, "batch_size": 64, "n_epochs": 2, "normalize_obs": True},
        tied={},
        run={"seed": 3, "eval_episodes": 2, "eval_max_steps": 0, "threads": 1, "device": "cpu"},
        budget_steps=1024,
        interval=128,
        study_dir=str(tmp_path),
        mutations={"learning_rate": LR_RANGE},
    )
    old, new = {"learning_rate": 3e-4}, {"learning_rate": 2e-3}
    a = build_trainer(spec, old, tmp_path / "a")
    a.begin(None)
    advance(a, spec.interval, spec.budget_steps)
    source = a.save_checkpoint(tmp_path / "a-checkpoint")
    b = build_trainer(spec, new, tmp_path / "b")  # with a history of its own, longer than A's
    b.begin(None)
    for _ in range(3):
        advance(b, spec.interval, spec.budget_steps)
    b.logger.monitor.file.flush()
    own_log = (tmp_path / "b" / "monitor.csv").read_text()
    b.load_checkpoint(source, rewind_logs=False)
    assert (tmp_path / "b" / "monitor.csv").read_text() == own_log  # not cut back to A's episodes
    assert (b.steps, b.iteration, b.episodes) == (a.steps, a.iteration, a.episodes)
    # A goes on in memory with the new learning rate: what the copy should do.
    a.algo.cfg = dataclasses.replace(a.algo.cfg, learning_rate=new["learning_rate"])
    advance(a, spec.interval, spec.budget_steps)
    advance(b, spec.interval, spec.budget_steps)
    c = build_trainer(spec, old, tmp_path / "c")  # the copy going on with the old learning rate
    c.load_checkpoint(source, rewind_logs=False)
    advance(c, spec.interval, spec.budget_steps)
    for key, tensor in a.state_tensors().items():  # weights, Adam's moments and step, obs/reward statistics
        assert torch.equal(tensor, b.state_tensors()[key]), key
    assert not torch.equal(b.agent.params.data, c.agent.params.data)
    assert len((tmp_path / "b" / "monitor.csv").read_text()) > len(own_log)  # its log goes on from its own rows
    for trainer in (a, b, c):
        trainer.close()


def test_a_copy_ranked_at_once_takes_its_source_at_the_round_when_tune_hands_over_a_later_checkpoint(tmp_path):
    """On a loaded machine Tune once handed a member copying at the round of step 2,048 its source's checkpoint
    at 4,096 (the source had trained on before the copy started): the copy came out an interval ahead of the
    population. The member takes its source's own checkpoint at the round instead; asynchronously, the newest."""
    spec = PBTSpec(
        algo="ppo",
        env="CartPole-v1",
        env_id="CartPole-v1",
        base={},
        tied={},
        run={},
        budget_steps=8192,
        interval=2048,
        study_dir=str(tmp_path),
        mutations={"learning_rate": LR_RANGE},
    )
    lr = {"learning_rate": 1e-3}

    def source_at(steps: int) -> MemberState:
        return MemberState("member-000", steps, lr, 0, [Segment("member-000", 0, steps, lr, None)])

    kept = spec.member_dir("member-000") / checkpoint.CHECKPOINTS_DIR
    for steps in (2048, 4096):
        (kept / f"step-{steps:012d}").mkdir(parents=True)
        source_at(steps).write(kept / f"step-{steps:012d}")
    handed = tmp_path / "ray" / "checkpoint_000001"
    handed.mkdir(parents=True)
    source_at(4096).write(handed)

    assert at_round(spec, handed, source_at(4096), 2048) == (kept / "step-000000002048", source_at(2048))
    assert at_round(spec, handed, source_at(4096), 4096) == (kept / "step-000000004096", source_at(4096))
    shutil.rmtree(kept / "step-000000004096")  # the source's own copy gone: Tune's, where it is the round's
    assert at_round(spec, handed, source_at(4096), 4096) == (handed, source_at(4096))
    assert at_round(dataclasses.replace(spec, synchronous=False), handed, source_at(4096), 2048) == (
        handed,
        source_at(4096),
    )
    with pytest.raises(RuntimeError, match="member-000 has no checkpoint at step 6,144 in "):
        at_round(spec, handed, source_at(8192), 6144)


# ---- a population on CartPole (Ray Tune) ----


def test_a_ranked_population_with_every_member_paused_past_the_round_lets_the_one_furthest_behind_go_on():
    """The stall once seen on a loaded machine: two members finished their budget, the two left wait paused at
    or past the round's step, and the last one's result holds no round (it was perturbed at that step). Without
    a member to run, the study would wait forever; the one furthest behind goes on."""
    pytest.importorskip("ray.tune")
    from types import SimpleNamespace

    from ray.tune.experiment import Trial

    from distrl.tune.ray_tune import SeededPBT

    scheduler = SeededPBT(
        seed=0,
        synch=True,
        time_attr="env_steps",
        metric="eval_return",
        mode="max",
        perturbation_interval=2048,
        hyperparam_mutations={"learning_rate": [1e-3, 2e-3]},
    )

    class Member:  # what the scheduler reads of a trial; hashable, as Tune's trials are
        def __init__(self, status: str, steps: int) -> None:
            self.status, self.last_result = status, {"env_steps": steps, "eval_return": 1.0}

    behind, ahead, done = Member(Trial.PAUSED, 4096), Member(Trial.PAUSED, 6144), Member(Trial.TERMINATED, 8192)
    controller = SimpleNamespace(get_trials=lambda: [done, behind, ahead], get_live_trials=lambda: {behind, ahead})
    scheduler._trial_state = {  # noqa: SLF001 - the scheduler's record of each member, as the stall left it
        trial: SimpleNamespace(last_train_time=steps, last_perturbation_time=steps)
        for trial, steps in ((done, 6144), (behind, 4096), (ahead, 6144))
    }
    scheduler._next_perturbation_sync = 4096  # noqa: SLF001
    assert scheduler.choose_trial_to_run(controller) is behind


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """One study for the tests below: 4 members, 2 at a time, learning rates drawn from 1e-6..3e-3 (seed 10 draws
    2.1e-3, 5.3e-6, 7.6e-4 and 3.3e-6), perturbed by 0.8 or 1.2 only."""
    pytest.importorskip("ray.tune")
    tmp_path = tmp_path_factory.mktemp("pbt")
    code, out = _run(_pbt(tmp_path, "--seed", "10", "--resample-probability", "0"))
    assert code == 0, out
    return tmp_path / "study", out


@pytest.mark.multiprocess
def test_a_population_exploits_by_truncation_and_records_its_lineage(study):
    study_dir, out = study
    events = read_lineage(study_dir / "lineage.jsonl")
    evals: dict[int, dict[str, float]] = {}
    for e in events:
        if e["event"] == "eval":
            evals.setdefault(e["step"], {})[e["member"]] = e["return"]
    assert sorted(evals) == [2048, 4096, 6144, 8192] and all(len(round_) == 4 for round_ in evals.values())
    exploits = [e for e in events if e["event"] == "exploit"]
    # Ranked at once after each interval but the last, the worst of four copies the best (quantile 0.25).
    assert sorted(e["step"] for e in exploits) == [2048, 4096, 6144]
    for e in exploits:
        round_ = evals[e["step"]]
        assert e["source_step"] == e["step"]
        assert round_[e["member"]] == min(round_.values()) and round_[e["source"]] == max(round_.values())
        src, new = e["source_hyperparameters"]["learning_rate"], e["new"]["learning_rate"]
        assert min(abs(new / min(max(src * f, 1e-6), 3e-3) - 1) for f in (0.8, 1.2)) < 1e-12
        assert f"{e['member']} copied {e['source']} at step {e['step']:,}" in out
    # The learning rate matters: the best member ends above every first evaluation (CartPole's returns start
    # near 20), with a rate far above the two smallest drawn.
    finals = {m: r for m, r in evals[8192].items()}
    best = max(finals, key=finals.get)
    assert finals[best] > 100 and finals[best] > max(evals[2048].values())
    assert schedule(events, best)[-1].hyperparameters["learning_rate"] > 1e-4
    # Every member is an ordinary run directory; its own record of its ancestry is the lineage's.
    for member in finals:
        run = study_dir / "members" / member
        summary = json.loads((run / "summary.json").read_text())
        assert summary["total_steps"] == BUDGET and summary["final_eval_mean_return"] == finals[member]
        assert (run / "monitor.csv").exists() and (run / checkpoint.MODEL_DIR / checkpoint.STATE).exists()
        kept = list((run / checkpoint.CHECKPOINTS_DIR).glob("step-*"))
        assert kept and all(MemberState.read(c).steps == int(c.name.removeprefix("step-")) for c in kept)
        final_lr = schedule(events, member)[-1].hyperparameters["learning_rate"]
        assert json.loads((run / "config.json").read_text())["ppo"]["learning_rate"] == final_lr
        assert MemberState.read(run).schedule == schedule(events, member)
    preset = json.loads((study_dir / "best.json").read_text())
    assert preset["learning_rate"] == schedule(events, best)[-1].hyperparameters["learning_rate"]
    assert preset["total_steps"] == BUDGET and preset["n_envs"] == 32  # the base preset's values come with it
    best_schedule = json.loads((study_dir / "best_schedule.json").read_text())
    assert best_schedule["member"] == best and best_schedule["checksum"]
    assert [Segment.from_json(s) for s in best_schedule["segments"]] == schedule(events, best)
    for plot in ("lineage.png", "schedule.png"):
        assert (study_dir / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"best: {best}, {finals[best]:.2f}" in out
    # Tune's checkpoints are distrl's files and the member's record: nothing pickled.
    tune_checkpoints = list((study_dir / "ray").glob("pbt/member-*/checkpoint_*"))
    assert tune_checkpoints and {p.name for c in tune_checkpoints for p in c.iterdir()} == {
        checkpoint.TENSORS,
        checkpoint.STATE,
        "member.json",
    }


@pytest.mark.multiprocess
def test_a_replayed_schedule_ends_with_the_members_exact_state(study, tmp_path):
    study_dir, _ = study
    events = read_lineage(study_dir / "lineage.jsonl")
    copied = max((e for e in events if e["event"] == "exploit"), key=lambda e: e["step"])["member"]
    for name, flags in (("best", []), (copied, ["--schedule", str(study_dir / "members" / copied / "member.json")])):
        code, out = _run(["tune", "replay", str(study_dir), "--run-dir", str(tmp_path / name), *flags])
        member = json.loads((study_dir / "best_schedule.json").read_text())["member"] if name == "best" else name
        assert code == 0 and f"equal to {member}'s final state" in out, out
        mine, _ = checkpoint.load(tmp_path / name / checkpoint.MODEL_DIR)
        theirs, _ = checkpoint.load(study_dir / "members" / member / checkpoint.MODEL_DIR)
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs if k.startswith("params/"))
    assert len(schedule(events, copied)) >= 2  # a replay across a copy, not only a run with one rate


@pytest.mark.multiprocess
@pytest.mark.heavy
def test_a_member_that_crashes_goes_on_from_its_last_checkpoint(tmp_path):
    pytest.importorskip("ray.tune")
    marker = tmp_path / "crashed"
    argv = _pbt(
        tmp_path,
        *("--env-kwargs", f"marker={marker}", "crash_step=2048", "--preset", "CartPole-v1"),
        population=2,
        budget=6144,
    )
    argv[2] = "distrl_pbtcrash:make_env"
    code, out = _run(argv)
    assert code == 0, out
    assert marker.exists()
    study_dir = tmp_path / "study"
    events = read_lineage(study_dir / "lineage.jsonl")
    restarts = [e for e in events if e["event"] == "restart"]
    assert len(restarts) == 1, events
    restart = restarts[0]
    assert (restart["failed_after"], restart["step"]) == (2048, 2048)
    assert "RuntimeError: the test's environment crashes once" in restart["error"]
    assert f"{restart['member']} failed after step 2,048" in out
    crashed = study_dir / "members" / restart["member"]
    assert json.loads((crashed / "summary.json").read_text())["total_steps"] == 6144
    # It went on exactly as if it had not crashed: its schedule, replayed without a crash, ends in its state.
    code, out = _run(
        ["tune", "replay", str(study_dir), "--schedule", str(crashed / "member.json"), "--run-dir", str(tmp_path / "r")]
    )
    assert code == 0 and f"equal to {restart['member']}'s final state" in out, out


@pytest.mark.multiprocess
@pytest.mark.slow  # a second study of 4 members (16 s): the default run keeps the shared study and replay
def test_a_synchronous_study_repeats_itself_whatever_parallel(study, tmp_path):
    """Ranked at once, with Tune's draws from the study's own stream: one member at a time makes the same
    decisions, evaluations and final states as two at a time."""
    study_dir, _ = study
    code, out = _run([*_pbt(tmp_path, "--seed", "10", "--resample-probability", "0"), "--parallel", "1"])
    assert code == 0, out

    def record(where: Path) -> list[str]:  # without the Ray node each interval ran on: each study has its own
        events = read_lineage(where / "lineage.jsonl")
        return sorted(json.dumps({k: v for k, v in e.items() if k != "node"}, sort_keys=True) for e in events)

    assert record(tmp_path / "study") == record(study_dir)
    for member in (study_dir / "members").iterdir():
        again = MemberState.read(tmp_path / "study" / "members" / member.name)
        assert again is not None and again.checksum == MemberState.read(member).checksum


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_member_given_up_leaves_the_others_to_finish(tmp_path):
    """With no restart allowed, the crashed member is given up; the synchronous population does not wait for it."""
    pytest.importorskip("ray.tune")
    argv = _pbt(
        tmp_path,
        *("--env-kwargs", f"marker={tmp_path / 'crashed'}", "crash_step=2048", "--preset", "CartPole-v1"),
        *("--max-failures", "0"),
        population=3,
        budget=6144,
    )
    argv[2] = "distrl_pbtcrash:make_env"
    proc = subprocess.run([sys.executable, "-m", "distrl", *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = read_lineage(tmp_path / "study" / "lineage.jsonl")
    failed = [e for e in events if e["event"] == "failed"]
    assert len(failed) == 1 and "crashes once" in failed[0]["error"]
    assert f"{failed[0]['member']} failed after step 2,048 and is given up" in proc.stdout
    finished = [m for m, (step, _) in final_returns(events).items() if step == 6144]
    assert len(finished) == 2 and failed[0]["member"] not in finished
    assert "| given up |" in proc.stdout


# ---- lineage, schedules and the report, from hand-written files ----


def _lineage() -> list[dict]:
    """Three members; b copies a at 200, c copies b at 400 (b's checkpoint after its copy), then a copies c's
    earlier checkpoint at 200 (a step a has passed: a goes back), and b restarts after a crash."""

    def ev(member, step, value):
        return {"event": "eval", "member": member, "step": step, "return": value}

    def exploit(member, step, source, source_step, source_exploits, old, new):
        lrs = {"old": {"lr": old}, "new": {"lr": new}, "source_hyperparameters": {"lr": new}}
        return {"event": "exploit", "member": member, "step": step, "source": source, "source_step": source_step,
                "source_exploits": source_exploits, **lrs}  # fmt: skip

    return [
        *({"event": "start", "member": m, "hyperparameters": {"lr": lr}} for m, lr in (("a", 1.0), ("b", 2.0), ("c", 3.0))),
        ev("a", 200, 10.0), ev("b", 200, 1.0), ev("c", 200, 5.0),
        exploit("b", 200, "a", 200, 0, 2.0, 1.2),
        ev("a", 400, 11.0), ev("b", 400, 20.0), ev("c", 400, 2.0),
        exploit("c", 400, "b", 400, 1, 3.0, 1.44),
        {"event": "restart", "member": "b", "failed_after": 400, "step": 400, "error": "RuntimeError: x"},
        ev("a", 600, 3.0), ev("b", 600, 30.0), ev("c", 600, 25.0),
        exploit("a", 600, "c", 200, 0, 1.0, 2.4),
        ev("a", 800, 4.0), ev("b", 800, 31.0), ev("c", 800, 40.0),
    ]  # fmt: skip


def test_schedules_follow_each_members_ancestry_through_copies_and_steps_back():
    events = _lineage()
    assert schedule(events, "b") == [Segment("a", 0, 200, {"lr": 1.0}, None), Segment("b", 200, 800, {"lr": 1.2}, "a")]
    assert schedule(events, "c") == [
        Segment("a", 0, 200, {"lr": 1.0}, None),
        Segment("b", 200, 400, {"lr": 1.2}, "a"),
        Segment("c", 400, 800, {"lr": 1.44}, "b"),
    ]
    # a copied c's checkpoint of step 200, written before c's own copy: c's first history, not its later one.
    assert schedule(events, "a") == [Segment("c", 0, 200, {"lr": 3.0}, None), Segment("a", 200, 800, {"lr": 2.4}, "c")]
    with pytest.raises(KeyError, match="'d' is not a member"):
        schedule(events, "d")


def test_report_writes_the_best_preset_schedule_table_and_plots(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    spec = PBTSpec(
        algo="ppo",
        env="CartPole-v1",
        env_id="CartPole-v1",
        base={"n_envs": 4},
        tied={},
        run={"seed": 0},
        budget_steps=800,
        interval=200,
        study_dir=str(tmp_path),
        mutations={"lr": {"type": "float", "low": 0.1, "high": 10.0, "log": True}},
    )
    (tmp_path / "pbt.json").write_text(spec.to_json())
    (tmp_path / "lineage.jsonl").write_text("".join(json.dumps(e) + "\n" for e in _lineage()) + '{"event": "ev')
    assert main(["tune", "report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    best = json.loads((tmp_path / "best_schedule.json").read_text())
    assert best["member"] == "c" and best["return"] == 40.0 and len(best["segments"]) == 3
    assert json.loads((tmp_path / "best.json").read_text())["lr"] == 1.44
    rows = [line.split("|")[2].strip() for line in out.splitlines() if line.startswith("| ") and "rank" not in line]
    assert rows == ["c", "b", "a"]  # by final return: 40, 31, 4
    assert "| 2 | b | 31.00 | 800 | done | 1 | 1 |" in out  # one exploit, one restart
    for plot in ("lineage.png", "schedule.png"):
        assert (tmp_path / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["tune", "report", str(tmp_path / "nothing")]) == 2
    assert "holds no lineage.jsonl: not a --scheduler pbt study" in capsys.readouterr().err


# ---- flags ----


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--population", "1"], "population=1 is not allowed: must be >= 2"),
        (["--perturbation-interval", "9000"], "perturbation_interval=9000 is not allowed: must be in [1, budget_steps=8192]"),
        (["--quantile", "0.6"], "quantile=0.6 is not allowed: must be in (0, 0.5]"),
        (["--quantile", "0"], "quantile=0.0 is not allowed: must be in (0, 0.5]"),
        (["--scheduler", "optuna", "--population", "4"], "population=4 is not allowed with scheduler='optuna': --population means something only with --scheduler pbt"),
        (["--storage", "sqlite:///x.db"], "storage='sqlite:///x.db' is not allowed with scheduler='pbt'"),
        (["--pruner", "none"], "pruner='none' is not allowed with scheduler='pbt'"),
        (["--perturbation-interval", "256"], "perturbation_interval=256 is not allowed: must be >= 512, one iteration (n_steps=16 × n_envs=32 = 512 steps)"),
        (["--space", "NETS"], "net_arch cannot be mutated by population-based training"),
    ],
)  # fmt: skip
def test_bad_flags_are_one_line_exit_2_and_start_nothing(tmp_path, capsys, flags, message):
    argv = _pbt(tmp_path)
    if "--space" in flags:
        nets = tmp_path / "nets.json"
        nets.write_text(json.dumps({"net_arch": ["tiny", "small"], "learning_rate": LR_RANGE}))
        flags = ["--space", str(nets)]
    pairs = dict(zip(flags[::2], flags[1::2]))
    for i, arg in enumerate(argv):  # a flag given twice: the test's value replaces the default one
        if arg in pairs:
            argv[i + 1] = pairs.pop(arg)
    argv += [x for kv in pairs.items() for x in kv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "study").exists()
