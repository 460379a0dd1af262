"""The 2026 instance matching: the official OR-Tools min-cost flow, and what it maximises.

The official flow network: source → each truth object (capacity 1), truth → prediction for every pair
with IoU > 0 at cost `c = int((1 − IoU)·10⁶)` (IoU rounded to float32 first), truth → sink at cost
`U = 10⁶ + 1` ("unmatched"), prediction → sink at cost 0; nG units of flow. A feasible flow is a
matching M of overlapping pairs plus one unmatched arc per truth object outside M, so its cost is

    cost(M) = Σ_{e ∈ M} c_e + (nG − |M|)·U  =  nG·U − Σ_{e ∈ M} w_e,   with  w_e = U − c_e ∈ [1, U].

Minimising the cost is therefore maximising the total integer weight `W(M) = Σ w_e` over matchings of
the overlap graph. This module maximises W exactly:

1. The overlap graph splits into connected components; a matching is a union of matchings of the
   components and W adds up, so each component is solved on its own (they are tiny in practice).
2. In a component with truth nodes G and prediction nodes P, fill a |G|×|P| matrix with `w_e·K + 1`
   on edges and 0 elsewhere (K = min(|G|, |P|) + 1) and run `scipy.optimize.linear_sum_assignment`
   with `maximize=True`. An assignment restricted to its edges is a matching of equal value (non-edges
   add 0), and every matching extends to an assignment of at least its value (the matrix is complete
   and entries are ≥ 0), so the optimum assignment, with non-edges dropped, is an optimal matching.
   Its value is `K·W(M) + |M|` with `|M| < K`, so W is maximised first and, among matchings of equal
   W, the number of matches second. All values are integers below 2⁵³, so the solver is exact.

Ties of equal W and equal |M| (e.g. two predictions with identical IoU for one truth object) are resolved by
the solver: which of the tied matchings OR-Tools returns depends on its algorithm and on the order the arcs were
added. So the scoring solves the official network itself (`flow_matching`): the same nodes (a node for every id
up to the largest truth id), arcs added in the same order, the same OR-Tools solver; ties then fall as they fall
in the official evaluator. `max_weight_matching` (scipy) is an independent exact optimum the tests check the
flow's total against.
"""

from __future__ import annotations

import numpy as np

from cellseg.eval.rules import COST_SCALE_2026


def flow_costs(iou_float32: np.ndarray) -> np.ndarray:
    """The official integer arc costs `int((1 − float(iou)) · 10⁶)` (truncation, not rounding)."""
    return ((1.0 - iou_float32.astype(np.float64)) * COST_SCALE_2026).astype(np.int64)


def match_weights(iou_float32: np.ndarray) -> np.ndarray:
    """Integer weights `w_e = (10⁶ + 1) − c_e` whose total the matching maximises."""
    return (COST_SCALE_2026 + 1) - flow_costs(iou_float32)


def _components(rows: np.ndarray, cols: np.ndarray, num_rows: int, num_cols: int) -> np.ndarray:
    """Component label of every edge of the bipartite graph (rows 0..num_rows-1, cols after them)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = num_rows + num_cols
    graph = coo_matrix((np.ones(rows.size, dtype=np.int8), (rows, cols + num_rows)), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    return labels[rows]


def max_weight_matching(rows: np.ndarray, cols: np.ndarray, weights: np.ndarray) -> list[tuple[int, int]]:
    """Maximum-total-weight 1:1 matching of the bipartite graph given as edges (rows[i], cols[i], weights[i]).

    Args:
        rows, cols: 0-based node indices of each edge (one edge per pair).
        weights: positive integer weights.

    Returns:
        The matched (row, col) pairs, sorted.
    """
    from scipy.optimize import linear_sum_assignment

    if rows.size == 0:
        return []
    row_ids, r_local = np.unique(rows, return_inverse=True)
    col_ids, c_local = np.unique(cols, return_inverse=True)
    comp = _components(r_local, c_local, row_ids.size, col_ids.size)
    matches: list[tuple[int, int]] = []
    order = np.argsort(comp, kind="stable")
    bounds = np.flatnonzero(np.diff(comp[order])) + 1
    for edges in np.split(order, bounds):
        if edges.size == 1:
            matches.append((int(rows[edges[0]]), int(cols[edges[0]])))
            continue
        g, gi = np.unique(rows[edges], return_inverse=True)
        p, pi = np.unique(cols[edges], return_inverse=True)
        scale = min(g.size, p.size) + 1
        matrix = np.zeros((g.size, p.size), dtype=np.float64)
        matrix[gi, pi] = weights[edges].astype(np.float64) * scale + 1.0
        sel_r, sel_c = linear_sum_assignment(matrix, maximize=True)
        matches += [(int(g[r]), int(p[c])) for r, c in zip(sel_r, sel_c, strict=True) if matrix[r, c] > 0]
    return sorted(matches)


def flow_matching(max_truth_id: int, num_pred: int, truth: np.ndarray, pred: np.ndarray, iou_float32: np.ndarray
                  ) -> dict[int, int] | None:
    """The official min-cost-flow matching, built as the official `_solve_matching_problem` builds it.

    Nodes: source 0, truth id t at t (1..`max_truth_id`, absent ids included), prediction id p at
    `max_truth_id` + p, the sink last. Arcs, in this order: source → every truth node (cost 0), every truth node
    → sink (10⁶ + 1), truth → prediction for each overlapping pair in the order of (truth id, prediction id)
    (`flow_costs`), every prediction node → sink (0); all capacity 1; supply `max_truth_id`.

    Args:
        max_truth_id, num_pred: the largest truth id and the number of prediction ids (1..num_pred).
        truth, pred: the ids of each overlapping pair (truth id ≥ 1, prediction id ≥ 1), any order.
        iou_float32: their IoU, rounded to float32 as the official code rounds it.

    Returns:
        prediction id → truth id of the matched pairs; None when the solver does not report an optimum (the
        official "matching_failed").

    Raises:
        ImportError: OR-Tools is not installed (naming the package).
    """
    try:
        from ortools.graph.python import min_cost_flow
    except ImportError as err:  # a dependency of cellseg: an environment built without it
        raise ImportError("the 2026 instance matching needs OR-Tools, the official evaluator's solver: "
                          "pip install ortools (see constraints.txt for the tested version)") from err
    order = np.lexsort((pred, truth))  # the official pairs come sorted by (truth, prediction)
    truth, pred, costs = truth[order], pred[order], flow_costs(iou_float32[order])
    gt = np.arange(1, max_truth_id + 1, dtype=np.int64)
    pred0, sink = max_truth_id + 1, max_truth_id + num_pred + 1
    preds = np.arange(pred0, sink, dtype=np.int64)
    tails = np.concatenate([np.zeros_like(gt), gt, truth.astype(np.int64), preds])
    heads = np.concatenate([gt, np.full_like(gt, sink), pred0 - 1 + pred.astype(np.int64), np.full_like(preds, sink)])
    unit = np.concatenate([np.zeros_like(gt), np.full_like(gt, COST_SCALE_2026 + 1), costs, np.zeros_like(preds)])
    flow = min_cost_flow.SimpleMinCostFlow()
    flow.add_arcs_with_capacity_and_unit_cost(tails.astype(np.int32), heads.astype(np.int32),
                                              np.ones(tails.size, dtype=np.int64), unit.astype(np.int64))
    flow.set_node_supply(0, max_truth_id)
    flow.set_node_supply(sink, -max_truth_id)
    if flow.solve() != flow.OPTIMAL:
        return None
    first, count = 2 * max_truth_id, truth.size  # the truth → prediction arcs
    used = np.flatnonzero(flow.flows(np.arange(first, first + count)) == 1)
    return {int(pred[a]): int(truth[a]) for a in used}
