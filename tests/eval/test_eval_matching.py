"""The 2026 matching equals the official min-cost flow's optimum (brute force over all matchings)."""

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cellseg.eval.matching import flow_costs, match_weights, max_weight_matching

U = 1_000_001  # the official "unmatched" arc cost


def _flow_cost(n_truth, edges, matching):
    """The official network's cost of the flow that uses `matching` (source/sink arcs cost 0)."""
    cost = {(r, c): w for r, c, w in edges}
    return sum(cost[m] for m in matching) + (n_truth - len(matching)) * U


def _all_matchings(edges):
    best = [()]
    for k in range(1, len(edges) + 1):
        for subset in itertools.combinations(edges, k):
            rows = [e[0] for e in subset]
            cols = [e[1] for e in subset]
            if len(set(rows)) == k and len(set(cols)) == k:
                best.append(tuple((e[0], e[1]) for e in subset))
    return best


@st.composite
def graphs(draw):
    n_rows = draw(st.integers(1, 5))
    n_cols = draw(st.integers(1, 5))
    pairs = draw(st.sets(st.tuples(st.integers(0, n_rows - 1), st.integers(0, n_cols - 1)), min_size=1, max_size=9))
    # IoUs from a small set of fractions so that ties happen often
    ious = [draw(st.sampled_from([1.0, 0.5, 1 / 3, 0.25, 0.2, 1e-6, 0.7, 0.1 + 0.2])) for _ in pairs]
    return n_rows, sorted(pairs), np.array(ious, dtype=np.float32)


@settings(max_examples=300, deadline=None)
@given(graphs())
def test_matching_minimises_the_official_flow_cost(graph):
    n_rows, pairs, ious = graph
    costs = flow_costs(ious)
    edges = [(r, c, int(w)) for (r, c), w in zip(pairs, costs, strict=True)]
    rows = np.array([p[0] for p in pairs])
    cols = np.array([p[1] for p in pairs])
    got = max_weight_matching(rows, cols, match_weights(ious))
    assert len({r for r, _ in got}) == len(got) == len({c for _, c in got})
    assert set(got) <= set(pairs)
    optimum = min(_flow_cost(n_rows, edges, m) for m in _all_matchings(edges))
    assert _flow_cost(n_rows, edges, got) == optimum
    # among optimal matchings, the most matches
    best = max(len(m) for m in _all_matchings(edges) if _flow_cost(n_rows, edges, m) == optimum)
    assert len(got) == best


def test_costs_truncate_like_the_official_int_cast():
    ious = np.array([1.0, 0.5, 1 / 3, 0.9999999], dtype=np.float32)
    expected = [int((1.0 - float(v)) * 1_000_000) for v in ious]
    assert flow_costs(ious).tolist() == expected
    assert (match_weights(ious) >= 1).all()


def test_large_components_are_solved_exactly():
    rng = np.random.default_rng(3)
    rows = rng.integers(0, 40, 300)
    cols = rng.integers(0, 60, 300)
    pairs = sorted(set(zip(rows.tolist(), cols.tolist(), strict=True)))
    rows, cols = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    weights = rng.integers(1, 1_000_001, rows.size)
    got = max_weight_matching(rows, cols, weights)
    from scipy.optimize import linear_sum_assignment

    dense = np.zeros((40, 60))
    dense[rows, cols] = weights
    r, c = linear_sum_assignment(dense, maximize=True)
    lookup = dict(zip(pairs, weights.tolist(), strict=True))
    assert sum(lookup[m] for m in got) == dense[r, c].sum()
