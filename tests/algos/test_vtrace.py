"""V-trace (Espeholt et al. 2018, arXiv:1802.01561) against a naive transcription of the paper's eq. 1, GAE in the
on-policy case, a hand-worked fragment, and the effect of the truncation levels rho_bar and c_bar."""

import math

import numpy as np
import pytest

from distrl.algos.estimators import gae, vtrace

INF = float("inf")


def fragment(seed: int, T: int, reset_steps: bool = True, spread: float = 1.5) -> dict[str, np.ndarray]:
    """A random [T, 3] fragment with episode ends that every test must handle.

    Env 0 terminates mid-fragment and is truncated at its last step, env 1 the other way round; env 2's
    last two steps are padding (invalid, with no episode end before them); all envs may also end at
    random. With ``reset_steps`` (next-step autoreset) the step after an end is the invalid reset step;
    without, the next episode starts at once, so only the end itself may stop the trace. Invalid steps
    carry garbage rewards, values and log-ratios that must not leak into any target.
    """
    N = 3
    rng = np.random.default_rng(seed)
    forced = {(0, T // 2): "term", (0, T - 1): "trunc", (1, T // 2 - 1): "trunc", (1, T - 1): "term"}
    terminated, truncated = np.zeros((T, N), bool), np.zeros((T, N), bool)
    valid = np.ones((T, N), bool)
    for n in range(N):
        for t in range(T):
            if (n == 2 and t >= T - 2) or (reset_steps and t > 0 and (terminated[t - 1, n] or truncated[t - 1, n])):
                valid[t, n] = False
                continue
            kind = forced.get((n, t))
            if kind is None and (n, t + 1) not in forced and rng.random() < 0.2:
                kind = "term" if rng.random() < 0.5 else "trunc"
            terminated[t, n], truncated[t, n] = kind == "term", kind == "trunc"
    return {
        "log_rhos": rng.normal(0.0, spread, (T, N)).astype(np.float32),
        "rewards": rng.normal(0.0, 1.0, (T, N)).astype(np.float32),
        "values": rng.normal(0.0, 1.0, (T + 1, N)).astype(np.float32),
        "terminated": terminated,
        "truncated": truncated,
        "valid": valid,
    }


def naive_vtrace(f: dict[str, np.ndarray], gamma: float, lam: float, rho_bar: float, c_bar: float):
    """Eq. 1 of the paper summed term by term, stopping where the episode (or the fragment) ends.

    Returns:
        vs and pg_advantages, [T, N] float64, 0 on invalid steps.
    """
    r, V, term, trunc, valid = f["rewards"], f["values"], f["terminated"], f["truncated"], f["valid"]
    T, N = r.shape
    ratio = np.exp(f["log_rhos"].astype(np.float64))
    rho, c = np.minimum(rho_bar, ratio), lam * np.minimum(c_bar, ratio)
    vs, pg = np.zeros((T, N)), np.zeros((T, N))
    for n in range(N):
        for s in range(T):
            if not valid[s, n]:
                continue
            v = float(V[s, n])
            for t in range(s, T):
                if not valid[t, n]:  # a reset step or padding: nothing flows through it
                    break
                next_value = 0.0 if term[t, n] else float(V[t + 1, n])
                delta = rho[t, n] * (r[t, n] + gamma * next_value - V[t, n])
                v += gamma ** (t - s) * math.prod(c[i, n] for i in range(s, t)) * delta
                if term[t, n] or trunc[t, n]:
                    break
            vs[s, n] = v
        for s in range(T):
            if not valid[s, n]:
                continue
            if term[s, n]:
                next_v = 0.0
            elif trunc[s, n] or s == T - 1 or not valid[s + 1, n]:  # the episode's data stops: bootstrap
                next_v = float(V[s + 1, n])
            else:
                next_v = vs[s + 1, n]
            pg[s, n] = rho[s, n] * (r[s, n] + gamma * next_v - V[s, n])
    return vs, pg


@pytest.mark.parametrize("lam", [1.0, 0.9])
@pytest.mark.parametrize("rho_bar, c_bar", [(1.0, 1.0), (0.5, 2.0), (2.0, 0.5), (INF, INF), (1.0, INF)])
@pytest.mark.parametrize("seed, T, reset_steps", [(0, 7, True), (1, 9, True), (2, 12, True), (3, 10, False)])
def test_matches_naive_transcription_of_the_paper(
    seed: int, T: int, reset_steps: bool, rho_bar: float, c_bar: float, lam: float
):
    f = fragment(seed, T, reset_steps)
    assert f["terminated"].any() and f["truncated"].any() and not f["valid"].all()
    clipped = np.exp(f["log_rhos"])[f["valid"]]
    assert (clipped > 2.0).any() and (clipped < 0.5).any(), "clipping must matter at every truncation level"
    out = vtrace(**f, gamma=0.9, lam=lam, rho_bar=rho_bar, c_bar=c_bar)
    vs, pg = naive_vtrace(f, 0.9, lam, rho_bar, c_bar)
    np.testing.assert_allclose(out.vs, vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages, pg, rtol=1e-5, atol=1e-5)
    assert (out.vs[~f["valid"]] == 0).all() and (out.pg_advantages[~f["valid"]] == 0).all()


@pytest.mark.parametrize("rho_bar, c_bar", [(1.0, 1.0), (2.0, INF)])
@pytest.mark.parametrize("lam", [1.0, 0.95])
@pytest.mark.parametrize("seed, reset_steps", [(3, True), (4, False)])
def test_on_policy_is_gae(seed: int, reset_steps: bool, lam: float, rho_bar: float, c_bar: float):
    f = fragment(seed, 10, reset_steps)
    f["log_rhos"] = np.zeros_like(f["log_rhos"])
    out = vtrace(**f, gamma=0.97, lam=lam, rho_bar=rho_bar, c_bar=c_bar)
    args = f["rewards"], f["values"], f["terminated"], f["truncated"], f["valid"]
    advantages, returns = gae(*args, 0.97, lam)
    valid = f["valid"]
    np.testing.assert_allclose((out.vs - f["values"][:10])[valid], advantages[valid], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.vs, returns, rtol=1e-5, atol=1e-5)


def test_on_policy_lambda_one_without_episode_end_is_the_n_step_return():
    rng = np.random.default_rng(5)
    T, gamma = 8, 0.9
    rewards = rng.normal(size=(T, 1)).astype(np.float32)
    values = rng.normal(size=(T + 1, 1)).astype(np.float32)
    no = np.zeros((T, 1), bool)
    out = vtrace(np.zeros((T, 1), np.float32), rewards, values, no, no, ~no, gamma)
    n_step = sum(gamma**t * float(rewards[t, 0]) for t in range(T)) + gamma**T * float(values[T, 0])
    assert out.vs[0, 0] == pytest.approx(n_step, rel=1e-5)


@pytest.mark.parametrize("terminated", [False, True])
def test_hand_worked_fragment(terminated: bool):
    # gamma = 0.5, V = 1, 2, 4, r = 1, 2, pi/mu = 2, 0.5 -> rho = c = 1 (clipped from 2), 0.5.
    # Step 1 ends the fragment (bootstraps from V(x_2) = 4) or terminates (does not):
    #   delta_1 = 0.5 (2 + 0.5 * 4 - 2) = 1            | terminated: 0.5 (2 - 2) = 0
    #   v_1 = 2 + 1 = 3                                | 2
    #   delta_0 = 1 (1 + 0.5 * 2 - 1) = 1
    #   v_0 = 1 + delta_0 + 0.5 * c_0 (v_1 - V_1) = 2.5 | 2
    #   pg_0 = rho_0 (1 + 0.5 v_1 - 1) = 1.5           | 1
    #   pg_1 = rho_1 (2 + 0.5 V(x_2) - 2) = 1          | 0.5 (2 - 2) = 0
    log_rhos = np.log(np.array([[2.0], [0.5]], np.float32))
    rewards = np.array([[1.0], [2.0]], np.float32)
    values = np.array([[1.0], [2.0], [4.0]], np.float32)
    term = np.array([[False], [terminated]])
    out = vtrace(log_rhos, rewards, values, term, np.zeros_like(term), np.ones_like(term), gamma=0.5)
    expected_vs, expected_pg = ([2.0, 2.0], [1.0, 0.0]) if terminated else ([2.5, 3.0], [1.5, 1.0])
    np.testing.assert_allclose(out.vs[:, 0], expected_vs, rtol=1e-6)
    np.testing.assert_allclose(out.pg_advantages[:, 0], expected_pg, rtol=1e-6)


@pytest.mark.parametrize("lam, c_bar", [(1.0, 0.0), (0.0, 1.0)])
def test_cut_traces_give_one_step_targets(lam: float, c_bar: float):
    f = fragment(6, 9)
    out = vtrace(**f, gamma=0.9, lam=lam, rho_bar=1.5, c_bar=c_bar)
    r, V, valid = f["rewards"], f["values"], f["valid"]
    rho = np.minimum(1.5, np.exp(f["log_rhos"].astype(np.float64)))
    one_step = V[:-1] + rho * (r + 0.9 * ~f["terminated"] * V[1:] - V[:-1])
    np.testing.assert_allclose(out.vs[valid], one_step[valid], rtol=1e-5, atol=1e-5)
    assert (out.vs[~valid] == 0).all()


def test_ratios_above_the_truncation_levels_act_on_policy():
    """With every pi/mu >= 1 and rho_bar = c_bar = 1, every weight is clipped to 1: V-trace is GAE(1)."""
    f = fragment(7, 9)
    f["log_rhos"] = np.abs(f["log_rhos"])
    out = vtrace(**f, gamma=0.9)
    _, returns = gae(f["rewards"], f["values"], f["terminated"], f["truncated"], f["valid"], 0.9, 1.0)
    np.testing.assert_allclose(out.vs, returns, rtol=1e-5, atol=1e-5)
    untruncated = vtrace(**f, gamma=0.9, rho_bar=INF, c_bar=INF)
    assert not np.allclose(untruncated.vs, out.vs)


def test_output_shapes_and_dtypes():
    f = fragment(8, 7)
    f["values"] = f["values"].astype(np.float64)
    out = vtrace(**f, gamma=0.99)
    for array in out:
        assert array.shape == (7, 3) and array.dtype == np.float32


def restarted_column(f: dict[str, np.ndarray], n: int, rng: np.random.Generator) -> tuple[dict, list[int]]:
    """Column ``n`` of a fragment with reset steps as a collector that begins each next episode at once records it,
    and the rows of the original it keeps. The reset step's row goes, and with it the final observation's value
    row, which moves to ``final_values``; where the fragment's last step ends an episode, the row after is the next
    episode's first observation, whose value must not be used (garbage here)."""
    T = len(f["rewards"])
    ended = f["terminated"][:, n] | f["truncated"][:, n]
    reset_rows = [t for t in range(1, T) if ended[t - 1] and not f["valid"][t, n]]
    keep = [t for t in range(T) if t not in reset_rows]
    values = np.delete(f["values"][:, n], reset_rows)
    if ended[T - 1]:
        values[-1] = rng.normal(0.0, 10.0)
    final = np.where(ended[keep], f["values"][np.array(keep) + 1, n], rng.normal(0.0, 10.0, len(keep)))
    column = {key: f[key][keep, n][:, None] for key in ("log_rhos", "rewards", "terminated", "truncated", "valid")}
    column.update(values=values[:, None].astype(np.float32), final_values=final[:, None].astype(np.float32))
    return column, keep


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_restarted_episodes_give_the_targets_of_the_reset_step_layout(seed: int):
    """A collector that begins the next episode at once records no reset step and each truncation's final value
    aside: V-trace and GAE give the same targets on the same transitions as with next-step autoreset."""
    f = fragment(seed, 12, reset_steps=True)
    old = vtrace(**f, gamma=0.9, lam=0.95, rho_bar=1.0, c_bar=1.0)
    old_adv, old_ret = gae(f["rewards"], f["values"], f["terminated"], f["truncated"], f["valid"], 0.9, 0.95)
    rng = np.random.default_rng(seed)
    for n in range(3):
        column, keep = restarted_column(f, n, rng)
        assert column["valid"][: len(keep) - 2].all()  # no reset steps left (env 2's padding stays)
        new = vtrace(**column, gamma=0.9, lam=0.95, rho_bar=1.0, c_bar=1.0)
        np.testing.assert_allclose(new.vs[:, 0], old.vs[keep, n], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(new.pg_advantages[:, 0], old.pg_advantages[keep, n], rtol=1e-5, atol=1e-5)
        args = [column[key] for key in ("rewards", "values", "terminated", "truncated", "valid")]
        adv, ret = gae(*args, 0.9, 0.95, final_values=column["final_values"])
        np.testing.assert_allclose(adv[:, 0], old_adv[keep, n], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ret[:, 0], old_ret[keep, n], rtol=1e-5, atol=1e-5)
