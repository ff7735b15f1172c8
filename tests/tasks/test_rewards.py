"""Reward functions (built-ins by hand, a user's, the errors that name them) and prompt datasets."""

import json
import time

import numpy as np
import pytest

from distrl.config import ConfigError
from distrl.tasks.builtin_rewards import exact_match, extract_answer, format_reward
from distrl.tasks.prompts import PromptDataset, TextTask
from distrl.tasks.rewards import RewardError, RewardSet


def test_the_built_in_rewards_by_hand():
    completions = ["<think>7+5</think><answer>12</answer>", " 12 ", "<answer>13</answer>", "<think>x</think> 12"]
    assert extract_answer(completions[0]) == "12" and extract_answer(completions[1]) == "12"
    assert exact_match([], completions, answer=["12", 12, "12", "12"]) == [1.0, 1.0, 0.0, 0.0]
    assert format_reward([], completions) == [1.0, 0.0, 0.0, 0.0]
    assert format_reward([], ["<think>a\nb</think>\n<answer>c</answer>\n"]) == [1.0]


def test_a_reward_set_weights_each_function_and_passes_the_fields_it_asks_for():
    rewards = RewardSet(["exact_match", "distrl_lm:length"], [2.0, 0.5])
    assert rewards.names == ("exact_match", "distrl_lm:length") and rewards.weights.tolist() == [2.0, 0.5]
    assert rewards.needs() == {"exact_match": ("answer",)}
    scores = rewards(["p", "p"], ["12", "123"], {"answer": ["12", "12"], "label": ["x", "y"]})
    assert scores.tolist() == [[1.0, 2.0], [0.0, 3.0]]
    only_named = RewardSet(["distrl_lm:needs_label"])  # no **fields: it is given only the fields it names
    assert only_named(["p"], ["x"], {"label": ["x"], "answer": ["1"]}).tolist() == [[1.0]]


def test_none_and_nan_score_zero_and_other_bad_values_are_named():
    args = (["p"] * 3, ["a", "b", "c"], {})
    assert RewardSet(["distrl_lm:none_and_nan"])(*args).tolist() == [[0.0], [0.0], [1.5]]
    with pytest.raises(RewardError, match="reward 'distrl_lm:infinite' returned inf at index 0: must return finite"):
        RewardSet(["distrl_lm:infinite"])(*args)
    with pytest.raises(RewardError, match="reward 'distrl_lm:text' returned a str: must return a list of 3 floats"):
        RewardSet(["distrl_lm:text"])(*args)


def test_a_reward_that_raises_returns_the_wrong_length_or_hangs_is_named():
    fields = {"answer": ["1", "2"]}
    with pytest.raises(RewardError, match="reward 'distrl_lm:raises' raised ZeroDivisionError: a reward that divides"):
        RewardSet(["distrl_lm:raises"])(["p", "p"], ["a", "b"], fields)
    with pytest.raises(RewardError, match="reward 'distrl_lm:wrong_length' returned 1 values for 2 completions"):
        RewardSet(["distrl_lm:wrong_length"])(["p", "p"], ["a", "b"], fields)
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"reward 'distrl_lm:hangs' did not return within reward_timeout_s=0.5 s"):
        RewardSet(["distrl_lm:hangs"], timeout_s=0.5)(["p", "p"], ["a", "b"], fields)
    assert time.monotonic() - start < 5


def test_bad_reward_names_are_one_line_errors():
    with pytest.raises(ConfigError, match="rewards='exact' is not known: must be a built-in"):
        RewardSet(["exact"])
    with pytest.raises(ConfigError, match="rewards='no_such_module:f': cannot import module"):
        RewardSet(["no_such_module:f"])
    with pytest.raises(ConfigError, match="rewards='distrl_lm:SPECIALS' is a list, not a function"):
        RewardSet(["distrl_lm:SPECIALS"])
    with pytest.raises(ConfigError, match="rewards='distrl_lm:make_model' has the signature"):
        RewardSet(["distrl_lm:make_model"])
    with pytest.raises(ConfigError, match=r"rewards=\(\) is not allowed: must name at least one"):
        RewardSet([])


def _write(path, lines):
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return str(path)


def test_a_dataset_is_read_in_seeded_epochs(tmp_path):
    path = _write(tmp_path / "d.jsonl", [{"prompt": f"p{i}", "answer": str(i)} for i in range(5)] + [""])
    data = PromptDataset(path, seed=3)
    first = data.row_indices(np.arange(5))
    assert sorted(first.tolist()) == [0, 1, 2, 3, 4]  # an epoch is a permutation of every line
    second = data.row_indices(np.arange(5, 10))
    assert sorted(second.tolist()) == [0, 1, 2, 3, 4] and not np.array_equal(first, second)
    assert np.array_equal(PromptDataset(path, seed=3).row_indices(np.array([7, 2])), [second[2], first[2]])
    chat = _write(tmp_path / "chat.jsonl", [{"prompt": [{"role": "user", "content": "hi"}]}])
    assert PromptDataset(chat).rows[0]["prompt"][0]["content"] == "hi"


def test_bad_datasets_are_one_line_errors_naming_the_line(tmp_path):
    cases = [
        (['{"prompt": "a"}', "{not json"], "line 2 is not JSON"),
        ([{"prompt": "a"}, [1, 2]], "line 2 is a list: must be a JSON object with a 'prompt' field"),
        ([{"question": "a"}], "line 1 has no 'prompt' field \\(its fields: question\\)"),
        ([{"prompt": 5}], "line 1: 'prompt' is a int: must be a string or a list of chat messages"),
        ([{"prompt": [{"role": "user"}]}], "line 1: a chat prompt must be a list of"),
        ([""], "holds no prompts"),
    ]
    for lines, message in cases:
        with pytest.raises(ConfigError, match=message):
            PromptDataset(_write(tmp_path / "bad.jsonl", lines))
    with pytest.raises(ConfigError, match="dataset='nowhere.jsonl' is not a file"):
        PromptDataset("nowhere.jsonl")
    missing = _write(tmp_path / "m.jsonl", [{"prompt": "a", "answer": "1"}, {"prompt": "b"}])
    with pytest.raises(ConfigError, match="line 2 has no field 'answer', which reward 'exact_match' needs"):
        TextTask(missing, ["exact_match"])


def test_a_text_task_scores_each_completion_with_its_prompts_fields(tmp_path):
    path = _write(tmp_path / "d.jsonl", [{"prompt": "a", "answer": "x"}, {"prompt": "b", "answer": "y"}])
    task = TextTask(path, ["exact_match", "distrl_lm:length"], [1.0, 0.1])
    positions = np.array([0, 1])
    rows = task.dataset.at(positions)
    texts = [rows[0]["answer"], "zz", rows[1]["answer"], rows[1]["answer"] + "!"]  # G = 2 completions each
    scores = task.rewards(positions, 2, np.zeros((4, 1), dtype=np.int64), texts)
    assert scores.tolist() == [[1.0, 1.0], [0.0, 2.0], [1.0, 1.0], [0.0, 2.0]]
