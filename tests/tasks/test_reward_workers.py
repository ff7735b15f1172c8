"""Reward functions in worker processes: a hung call is killed with what it started and scored, a raising one ends
the run or is scored as the policy says, calls run in parallel, nothing outlives the run, and a GRPO run names
every failed call in events.log and summary.json."""

import dataclasses
import json
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from distrl.config import ConfigError
from distrl.data.groups import GroupSamples, score_groups
from distrl.tasks.prompts import TextTask
from distrl.tasks.rewards import RewardError, RewardSet

psutil = pytest.importorskip("psutil")

pytestmark = pytest.mark.multiprocess

HANGS = "distrl_lm:hangs_when_asked"


def write_lines(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone_within(pids, seconds):
    """Whether every one of ``pids`` has ended within ``seconds``."""
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def descendants():
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture
def hang_data(tmp_path):
    """Four lines; the one on file line 3 makes distrl_lm:hangs_when_asked hang."""
    rows = [{"prompt": p, "hang": p == "c"} for p in "abcd"]
    return write_lines(tmp_path / "hang.jsonl", rows)


def test_calls_behind_a_hung_one_in_its_chunk_go_to_another_worker_and_are_scored(tmp_path):
    """Forty calls on two workers go out five to a message; a hung call's worker is killed with the calls it had
    not begun, and those are made elsewhere: every call but the hung ones gets its own score, once."""
    rows = [{"prompt": str(i), "hang": i == 3} for i in range(10)]
    task = TextTask(write_lines(tmp_path / "d.jsonl", rows), [HANGS], reward_timeout_s=1, reward_workers=2)
    try:
        positions = np.arange(10)
        hangs = [rows[i]["hang"] for i in task.dataset.row_indices(positions)]
        texts = ["x" * (i + 1) for i in range(40)]  # G = 4 completions per prompt
        scored = task.score(positions, 4, np.zeros((40, 1), dtype=np.int64), texts)
        hung = [row for row in range(40) if hangs[row // 4]]
        assert len(hung) == 4
        assert scored.scores[:, 0].tolist() == [0.0 if row in hung else row + 1.0 for row in range(40)]
        assert sorted(f.index for f in scored.failures) == hung
        assert all(f.timed_out for f in scored.failures)
    finally:
        task.close()


def test_a_hung_call_scores_the_timeout_score_and_is_named_by_its_dataset_line(hang_data):
    task = TextTask(
        hang_data, [HANGS, "distrl_lm:length"], reward_timeout_s=1, reward_workers=2, reward_timeout_score=-1
    )
    try:
        positions = np.arange(4)
        lines = [task.dataset.lines[i] for i in task.dataset.row_indices(positions)]
        texts = ["x" * (i + 1) for i in range(8)]  # G = 2 completions per prompt
        start = time.monotonic()
        scored = task.score(positions, 2, np.zeros((8, 1), dtype=np.int64), texts)
        assert time.monotonic() - start < 30
        hung = [row for row in range(8) if lines[row // 2] == 3]
        assert len(hung) == 2
        expected = np.array([[-1.0 if row in hung else row + 1.0, row + 1.0] for row in range(8)], dtype=np.float32)
        assert scored.scores.tolist() == expected.tolist()  # the length reward scored every completion
        assert [(f.reward, f.index, f.timed_out) for f in scored.failures] == [(HANGS, row, True) for row in hung]
        assert [f.text for f in scored.failures] == [
            f"dataset line 3 (completion {j} of 2): reward '{HANGS}' did not return within reward_timeout_s=1 s; "
            "scored -1"
            for j in (1, 2)
        ]
        assert scored.seconds.shape == (8, 2) and (scored.seconds[hung, 0] >= 1).all()
        assert (scored.seconds[:, 1] < 1).all()
        # the failures travel with their rows when a batch is scored, cut into slices and joined again
        samples = GroupSamples(
            positions=positions,
            group_size=2,
            prompt=np.zeros((8, 1), dtype=np.int64),
            prompt_mask=np.ones((8, 1), dtype=bool),
            tokens=np.ones((8, 2), dtype=np.int64),
            mask=np.ones((8, 2), dtype=bool),
            log_probs=np.zeros((8, 2), dtype=np.float32),
            version=np.zeros(8, dtype=np.int64),
            texts=tuple(texts),
        )
        batch = score_groups(task, samples)
        assert batch.reward_failures == scored.failures and batch.reward_seconds.shape == (8, 2)
        pieces = batch.split(1)
        owner = hung[0] // 2
        assert [len(p.reward_failures) for p in pieces] == [2 if i == owner else 0 for i in range(4)]
        assert [f.index for f in pieces[owner].reward_failures] == [0, 1]
        again = GroupSamples.concat(pieces[::-1])  # the hung prompt now sits at 3 - owner
        assert [f.index for f in again.reward_failures] == [2 * (3 - owner), 2 * (3 - owner) + 1]
    finally:
        task.close()


def test_a_timed_out_call_is_killed_with_the_processes_it_started(tmp_path):
    pid_file = tmp_path / "pids"
    rewards = RewardSet(["distrl_lm:starts_a_child_when_asked"], timeout_s=1, workers=2)
    before = descendants()
    try:
        scored = rewards.score(["p", "p"], ["a", "b"], {"pid_file": [str(pid_file)] * 2, "hang": [True, False]})
        assert scored.scores.tolist() == [[0.0], [1.0]] and [f.index for f in scored.failures] == [0]
        calls = dict(line.split() for line in pid_file.read_text().splitlines())
        hung_worker, child = next((int(w), int(c)) for w, c in calls.items() if c != "0")
        assert gone_within([hung_worker, child], 5)  # the worker and the `sleep` it started
        idle = [int(w) for w, c in calls.items() if c == "0"]
        assert all(alive(pid) for pid in idle)  # the other worker stays for the next call
    finally:
        rewards.close()
    assert gone_within(idle, 5) and descendants() <= before


def test_under_the_fail_policy_a_hung_call_ends_scoring_with_one_line_and_the_workers_go_on(hang_data):
    task = TextTask(hang_data, [HANGS], reward_timeout_s=1, reward_workers=2, reward_timeout_policy="fail")
    try:
        hung = int(np.flatnonzero(np.array(task.dataset.lines)[task.dataset.row_indices(np.arange(4))] == 3)[0])
        with pytest.raises(RewardError) as failed:
            task.score(np.arange(4), 1, np.zeros((4, 1), dtype=np.int64), ["aa"] * 4)
        assert str(failed.value) == (
            f"reward '{HANGS}' did not return within reward_timeout_s=1 s on dataset line 3 (completion 1 of 1)"
        )
        # the calls under way were killed: later calls get their own answers, not the old ones
        others = [p for p in range(4) if p != hung]
        assert task.rewards(np.array(others), 1, np.zeros((3, 1)), ["a", "bb", "ccc"]).tolist() == [[1.0], [2.0], [3.0]]
    finally:
        task.close()


@pytest.mark.parametrize("workers", [1, 0])
def test_a_raising_reward_ends_scoring_or_scores_the_timeout_score_as_the_error_policy_says(workers):
    args = (["p"] * 3, ["a", "bb", "ccc"], {"fail": [False, True, False]})
    fail = RewardSet(["distrl_lm:raises_when_asked"], workers=workers)
    with pytest.raises(RewardError) as failed:
        fail(*args)
    assert str(failed.value) == "reward 'distrl_lm:raises_when_asked' raised ValueError: asked to fail"
    fail.close()
    score = RewardSet(["distrl_lm:raises_when_asked"], workers=workers, error_policy="score", timeout_score=0.5)
    try:
        scored = score.score(*args)
    finally:
        score.close()
    if workers:  # one call per completion: only the raising one scores the timeout score
        assert scored.scores.tolist() == [[1.0], [0.5], [3.0]]
        assert [(f.index, f.timed_out) for f in scored.failures] == [(1, False)]
        assert scored.failures[0].text == (
            "completion 2 of 3: reward 'distrl_lm:raises_when_asked' raised ValueError: asked to fail; scored 0.5"
        )
    else:  # one call for the batch: every completion in it does
        assert scored.scores.tolist() == [[0.5]] * 3 and [f.index for f in scored.failures] == [0, 1, 2]


def test_wrong_values_and_dead_workers_are_errors_named_by_reward():
    rewards = RewardSet(
        ["distrl_lm:wrong_length", "distrl_lm:dies", "distrl_lm:length"], workers=1, error_policy="score"
    )
    try:
        scored = rewards.score(["p"], ["abc"], {})
    finally:
        rewards.close()
    assert scored.scores.tolist() == [[0.0, 0.0, 3.0]]  # the dead worker was replaced for the next call
    assert [f.text for f in scored.failures] == [
        "completion 1 of 1: reward 'distrl_lm:wrong_length' returned 0 values for 1 completions: must return one "
        "float per completion; scored 0",
        "completion 1 of 1: reward 'distrl_lm:dies' ended its worker process (exit status 3); scored 0",
    ]


def test_calls_run_in_parallel_on_the_workers():
    rewards = RewardSet(["distrl_lm:half_a_second"], workers=2)
    try:
        rewards(["p"] * 4, ["a"] * 4, {})  # both workers start (seconds: an interpreter each) before the clock runs
        start = time.monotonic()
        assert rewards(["p"] * 4, ["a"] * 4, {}).tolist() == [[1.0]] * 4
        elapsed = time.monotonic() - start
    finally:
        rewards.close()
    assert elapsed < 1.6, elapsed  # two at a time: about 1 s; one at a time would be 2 s


def test_bad_settings_are_one_line_errors():
    with pytest.raises(ConfigError, match="reward_timeout_policy='kill' is not allowed: must be one of score, fail"):
        RewardSet(["exact_match"], timeout_policy="kill")
    with pytest.raises(ConfigError, match="reward_workers=-1 is not allowed: must be >= 0"):
        RewardSet(["exact_match"], workers=-1)


def test_workers_end_with_their_parent_and_a_call_cut_short_by_ctrl_c_is_killed(tmp_path):
    pid_file = tmp_path / "pids"
    script = textwrap.dedent(
        f"""
        import _thread, os, signal, threading, time
        from distrl.tasks.rewards import RewardSet

        # Ctrl-C's handler as a terminal's interpreter has it: an ignored SIGINT survives exec, and a parent
        # started with it ignored never sees the interrupt below (the test then waited out its 120 s once)
        signal.signal(signal.SIGINT, signal.default_int_handler)

        def interrupt_once_the_idle_call_answered():
            # both calls made, and the idle one's answer read: until the pool reads it, that call too is under
            # way, and Ctrl-C rightly kills its worker with it (on a loaded machine the read can lag the write)
            while True:
                pool = getattr(globals().get("rewards"), "_pool", None)
                made = os.path.exists({str(pid_file)!r}) and len(open({str(pid_file)!r}).readlines()) == 2
                if made and pool is not None and sum(w.job is not None for w in pool.workers) == 1:
                    break
                time.sleep(0.05)
            _thread.interrupt_main()

        threading.Thread(target=interrupt_once_the_idle_call_answered, daemon=True).start()
        rewards = RewardSet(["distrl_lm:starts_a_child_when_asked"], timeout_s=600, workers=2)
        try:
            rewards(["p", "p"], ["a", "b"], {{"pid_file": [{str(pid_file)!r}] * 2, "hang": [True, False]}})
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        time.sleep(600)
        """
    )
    err = tmp_path / "stderr"
    with err.open("w") as stderr:  # a file, not a pipe, so that a failure can show what the parent said
        parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=stderr, text=True)
    deadline = threading.Timer(120, parent.kill)  # the read below waits no longer than that
    deadline.start()
    try:
        assert parent.stdout.readline().strip() == "interrupted", err.read_text()
        calls = dict(line.split() for line in pid_file.read_text().splitlines())
        hung = [int(p) for pair in calls.items() if pair[1] != "0" for p in pair]
        idle = [int(w) for w, c in calls.items() if c == "0"]
        assert gone_within(hung, 5)  # the call under way, and the `sleep` it started, died with Ctrl-C
        assert all(alive(pid) for pid in idle)
        parent.send_signal(signal.SIGKILL)  # no close, no atexit: the idle worker must notice by itself
        assert gone_within(idle, 5)
    finally:
        deadline.cancel()
        parent.kill()
        parent.wait(10)


def test_a_grpo_run_goes_on_past_hung_rewards_and_names_them(tmp_path, hang_data):
    pytest.importorskip("transformers")
    from distrl.cli import main
    from distrl_lm import DIGITS, make_model

    model = make_model(tmp_path / "model", chars=DIGITS + list("abcd"), hidden=16, layers=1)
    run_dir = tmp_path / "run"
    before = descendants()
    flags = ["--model", model, "--dataset", hang_data, "--reward", HANGS, "--reward-timeout-s", "1"]
    flags += ["--group-size", "2", "--prompts-per-slice", "2", "--slices-per-step", "1", "--learner-steps", "2"]
    assert main(["train", "grpo", *flags, "--max-new-tokens", "3", "--quiet", "--run-dir", str(run_dir)]) == 0
    assert descendants() <= before  # the reward workers went with the run
    summary = json.loads((run_dir / "summary.json").read_text())
    # two steps of two prompts are the four lines once: line 3's two completions, then its greedy one
    expected = [
        f"dataset line 3 (completion {j} of {g}): reward '{HANGS}' did not return within reward_timeout_s=1 s; scored 0"
        for j, g in ((1, 2), (2, 2), (1, 1))
    ]
    assert summary["reward_timeouts"] == 3 and summary["reward_errors"] == 0
    assert summary["reward_failures"] == expected
    assert summary["reward_time_s"][HANGS]["p95"] >= 1 and summary["reward_time_s"][HANGS]["mean"] > 0
    events = (run_dir / "events.log").read_text()
    assert all(text in events for text in expected)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set(EventAccumulator(str(run_dir)).Reload().Tags()["scalars"])
    assert {f"rewards/{HANGS}/time_mean_s", f"rewards/{HANGS}/time_p95_s", "rewards/timeouts"} <= tags


def test_the_pipeline_waits_for_the_scorer_as_long_as_its_calls_may_take():
    from distrl.config import GRPOConfig
    from distrl.strategies.pipeline import scoring_bound_s
    from distrl.tasks.reward_workers import START_TIMEOUT_S

    cfg = GRPOConfig(
        rewards=("a:b", "c:d"),
        group_size=4,
        prompts_per_slice=2,
        slices_per_call=1,
        reward_timeout_s=3,
        reward_workers=4,
    )
    assert scoring_bound_s(cfg) == 4 * (3 + START_TIMEOUT_S)  # 16 calls, 4 at a time, each timing out
    assert scoring_bound_s(dataclasses.replace(cfg, reward_workers=0)) == 2 * 3  # one call per reward


def test_no_worker_starts_before_the_first_call(hang_data):
    before = descendants()
    task = TextTask(hang_data, [HANGS], reward_workers=2)
    assert sorted(task.prompts(np.arange(4))) == ["a", "b", "c", "d"]
    assert descendants() == before  # a pipeline's generators read prompts with a task that never scores
    task.close()
