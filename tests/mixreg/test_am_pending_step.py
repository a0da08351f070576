"""Gradient AM applies each step to the residuals in the next evaluation's pass over the rows,
and marks each row's line in one pass over booleans: the lines and losses must be those of the
straightforward code, bit for bit."""

import numpy as np
import pytest
from numpy.typing import NDArray

import mixreg._am as am
from mixreg._am import Evaluation, _GradientSteps, gradient_am, run_iterations
from mixreg.datasets import make_realizable

FloatArray = NDArray[np.float64]


class _EagerSteps(_GradientSteps):
    """The steps as first written: each update applies itself to every block's residuals in a
    pass of its own, before the next evaluation reads them again; each row's line is found by
    setting labels line by line."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.labels = [np.zeros(b.stop - b.start, dtype=np.intp) for b in self.blocks]

    def evaluate(self) -> Evaluation:
        """Assign the rows, and sum the min-loss and each line's gradient over its rows."""
        refresh = self.steps_since_refresh >= am._RESIDUAL_REFRESH
        if refresh:
            self.steps_since_refresh = 0
        total = 0.0
        self.gradient.fill(0.0)
        for index, (block, residuals, labels) in enumerate(
            zip(self.blocks, self.residuals, self.labels, strict=True)
        ):
            Zb = self.Z[block]
            if refresh:
                np.matmul(self.theta, Zb.T, out=residuals)
                np.subtract(self.y[block], residuals, out=residuals)
            mask = self._assign(residuals, labels)
            # -grad F_i(theta_j) / 2 = z_i r_ij, summed over the rows S_j that line j wins.
            owned = residuals * mask
            best = owned.sum(axis=0)
            if self.block_weights is None:
                total += float(best @ best)
                self.gradient += owned @ Zb
            else:
                weights = self.block_weights[index]
                total += float((best * weights) @ best)
                self.gradient += (owned * weights) @ Zb
        loss = total / self.total_weight
        return Evaluation(loss=loss, criterion=loss)

    def _assign(self, residuals: FloatArray, labels: NDArray[np.intp]) -> NDArray[np.bool_]:
        """Each row's best line (ties to the lowest index), as labels and a one-hot mask."""
        squared = residuals * residuals
        smallest = squared[0]
        labels.fill(0)
        for component in range(1, self.n_components):
            closer = squared[component] < smallest
            labels[closer] = component
            np.minimum(smallest, squared[component], out=smallest)
        mask: NDArray[np.bool_] = labels == self.parts
        return mask

    def update(self) -> None:
        if self.preconditioner is None:
            step = self.fixed_scale * self.gradient
            self.theta += step
            for block, residuals in zip(self.blocks, self.residuals, strict=True):
                residuals -= step @ self.Z[block].T
        else:
            self._subspace_step(self.gradient @ self.preconditioner)
        self.steps_since_refresh += 1

    def _subspace_step(self, direction: FloatArray) -> None:
        """Move each line to its exact minimizer, on its rows, in span{direction, previous step}.

        Without a previous step (or when it is parallel to the direction) this is the exact
        line search along ``direction``.
        """
        k, previous = self.n_components, self.previous_step
        # Per line, over its rows: <u,u>, <u,v>, <v,v>, <v,r> with u the direction's change
        # of predictions and v the previous step's.
        uu, uv, vv, vr = (np.zeros(k) for _ in range(4))
        for index, (block, residuals, labels, change, previous_change) in enumerate(
            zip(
                self.blocks,
                self.residuals,
                self.labels,
                self.change,
                self.previous_change,
                strict=True,
            )
        ):
            np.matmul(direction, self.Z[block].T, out=change)
            mask: NDArray[np.bool_] | FloatArray = labels == self.parts
            if self.block_weights is not None:
                mask = mask * self.block_weights[index]
            own = change * mask
            uu += np.einsum("kn,kn->k", own, change)
            if previous is not None:
                uv += np.einsum("kn,kn->k", own, previous_change)
                previous_own = previous_change * mask
                vv += np.einsum("kn,kn->k", previous_own, previous_change)
                vr += np.einsum("kn,kn->k", previous_own, residuals)
        # sum_{i in S_j} r_i <z_i, d_j> = <gradient_j, d_j>
        ur = np.einsum("kp,kp->k", self.gradient, direction)
        along = np.where(uu > 0, ur / np.where(uu > 0, uu, 1.0), 0.0)
        again = np.zeros(k)
        if previous is not None:
            determinant = uu * vv - uv * uv
            # Nearly parallel directions (or an empty line) fall back to the line search.
            plane = determinant > 1e-12 * uu * vv
            safe = np.where(plane, determinant, 1.0)
            along = np.where(plane, (vv * ur - uv * vr) / safe, along)
            again = np.where(plane, (uu * vr - uv * ur) / safe, 0.0)
        step = along[:, None] * direction
        if previous is not None:
            step += again[:, None] * previous
        for residuals, change, previous_change in zip(
            self.residuals, self.change, self.previous_change, strict=True
        ):
            # The step's change of predictions, kept for the next step.
            change *= along[:, None]
            if previous is not None:
                previous_change *= again[:, None]
                previous_change += change
            else:
                previous_change[...] = change
            residuals -= previous_change
        self.theta += step
        self.previous_step = step


def _eager_gradient_am(Z, y, theta, step_size, max_iter, sample_weight=None):
    steps = _EagerSteps(Z, y, theta.copy(), step_size, sample_weight)
    result = run_iterations(
        steps.evaluate, steps.update, max_iter=max_iter, tol=-1.0, deadline=None, callback=None
    )
    return steps.theta, result.loss_history


@pytest.mark.parametrize("step_size", [0.1, "auto"])
@pytest.mark.parametrize("weighted", [False, True])
def test_pending_step_gives_the_lines_and_losses_bit_for_bit(monkeypatch, step_size, weighted):
    # Small blocks, so that many blocks each take their own pending update; more iterations
    # than the residuals' refresh period, so refreshed and updated residuals both occur.
    monkeypatch.setattr(am, "_BLOCK_ELEMENTS", 3 * 97)
    X, y, *_ = make_realizable(2_000, 4, 3, noise=0.3, random_state=0)
    Z = np.column_stack([X / np.abs(X).max(), np.ones(len(X))])
    y = y / np.abs(y).max()
    theta = np.random.default_rng(1).normal(size=(3, Z.shape[1]))
    weights = np.random.default_rng(2).uniform(0.5, 2.0, len(y)) if weighted else None
    # A negative tol never stops early, even where the loss no longer changes.
    max_iter = 2 * am._RESIDUAL_REFRESH + 7
    fused = gradient_am(
        Z, y, theta, step_size=step_size, max_iter=max_iter, tol=-1.0, sample_weight=weights
    )
    eager_theta, eager_losses = _eager_gradient_am(Z, y, theta, step_size, max_iter, weights)
    assert fused.n_iter == max_iter
    assert np.array_equal(fused.theta, eager_theta)
    assert fused.loss_history == eager_losses
    assert eager_losses[-1] < eager_losses[0]


def test_one_hot_owners_are_the_line_by_line_labels_with_ties_and_non_finite_residuals():
    rng = np.random.default_rng(3)
    residuals = rng.normal(size=(4, 500))
    residuals[2, :50] = -residuals[1, :50]  # exact ties: the lower line keeps the row
    residuals[:, 50:60] = 0.5  # four-way ties
    residuals[3, 60:70] = np.inf
    residuals[:, 70:75] = np.inf
    steps = _GradientSteps(np.ones((500, 1)), np.zeros(500), np.zeros((4, 1)), 0.1)
    owners = np.zeros((4, 500), dtype=bool)
    expected = _EagerSteps._assign(steps, residuals, np.zeros(500, dtype=np.intp))
    assert np.array_equal(steps._assign(residuals, owners), expected)
    assert owners[:, :50].sum(axis=0).tolist() == [1] * 50
    # A NaN anywhere sends the block through the line-by-line comparisons.
    residuals[2, 100] = np.nan
    expected = _EagerSteps._assign(steps, residuals, np.zeros(500, dtype=np.intp))
    assert np.array_equal(steps._assign(residuals, owners), expected)
