"""benchmarks/harness.py: the per-seed ratio, which compares each seed's two runs where the host's speed drifts."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

import harness  # noqa: E402


def test_the_per_seed_ratio_compares_each_seeds_two_runs_where_the_ratio_of_medians_mixes_minutes():
    # distrl runs at 200 steps/s and the reference at 100; the host halves its speed from the third to the fifth of
    # the six runs, taken in alternate's order (seed 0 mine then theirs, seed 1 theirs then mine, seed 2 mine then
    # theirs).
    mine, theirs = [200.0, 100.0, 100.0], [100.0, 50.0, 100.0]
    assert harness.median(mine) / harness.median(theirs) == 1.0
    assert harness.paired_ratio(mine, theirs) == 2.0  # 2, 2 and 1


def test_the_per_seed_ratio_leaves_out_a_missing_run_and_is_none_without_a_pair():
    assert harness.paired_ratio([3.0, None, 8.0], [1.0, 2.0, 4.0]) == 2.5  # median of 3 and 2
    assert harness.paired_ratio([3.0], [0.0]) is None
    assert harness.paired_ratio([], [1.0]) is None
