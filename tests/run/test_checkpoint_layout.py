"""Checkpoints outlive the package's layout: none records a module path, and the ones written before the package
had its folders (``fixtures/pre_folders_*``, with the actions they predicted then) load and act as they did."""

import json
from pathlib import Path

import numpy as np
import pytest

from distrl import APPO, PPO

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("name, cls", [("ppo", PPO), ("appo", APPO)])
def test_a_checkpoint_from_before_the_folders_loads_and_acts_as_it_did(name, cls):
    recorded = json.loads((FIXTURES / "pre_folders_actions.json").read_text())
    model = cls.load(FIXTURES / f"pre_folders_{name}", device="cpu")
    actions, _ = model.predict(np.asarray(recorded["observations"], dtype=np.float32))
    model.close()
    assert np.asarray(actions).tolist() == recorded[name]


def test_no_checkpoint_file_names_a_module_of_distrl(tmp_path):
    model = PPO("CartPole-v1", seed=0, n_envs=2, n_steps=16, batch_size=32, n_epochs=1).learn(32)
    model.save(tmp_path / "m")
    model.close()
    texts = [p.read_text() for p in (tmp_path / "m").glob("*.json")]
    assert texts and not any("distrl." in text for text in texts)
