"""Pictures of fits as PNG: a model with its data, and a k sweep's scores against k.

Drawn with matplotlib's object-oriented API on the Agg canvas (no pyplot, no display), one
picture at a time: the routes call these functions from worker threads, and matplotlib's
shared state (font cache, text layout) is not thread-safe. matplotlib is imported on the first
picture, so the server starts without it.
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray
from scipy.special import ndtri

if TYPE_CHECKING:
    from matplotlib.axes import Axes

FloatArray = NDArray[np.float64]

MAX_POINTS = 5000
"""At most this many rows are drawn; of a larger dataset, a seeded sample
(``models_store.datasets.sample_dataset_rows``)."""

# matplotlib's default cycle ("tab10"): the component colours of every picture.
COMPONENT_COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
FIGURE_SIZE = (10.0, 4.2)
DPI = 100

_render_lock = threading.Lock()


@dataclass(frozen=True)
class ConfidenceBands:
    """Per line, the maximum-likelihood line (coefficients then intercept, if any) and the
    covariance of those numbers: a band of ``level`` around each line."""

    lines: FloatArray  # (k, p)
    covariances: FloatArray  # (k, p, p)
    level: float


@dataclass(frozen=True)
class ModelPicture:
    """What the picture of a model needs: its lines, its history and its dataset's rows (all
    of them, or at most MAX_POINTS of its ``n_rows`` drawn at random)."""

    title: str
    coef: FloatArray  # (k, d)
    intercept: FloatArray  # (k,)
    feature_names: list[str]
    target_name: str | None
    loss_history: list[float]
    X: FloatArray
    y: FloatArray
    n_rows: int
    # As recorded: each line's share of the training rows, and the fit's iterations.
    shares: FloatArray
    n_iter: int
    converged: bool | None
    bands: ConfidenceBands | None = None


@dataclass(frozen=True)
class SweepPicture:
    """What the picture of a k sweep needs: its scores per k."""

    title: str
    k_values: list[int]
    train_min_loss: list[float]
    holdout_min_loss: list[float | None]
    bic: list[float]
    best_k: int


def _suptitle(figure: Any, title: str) -> None:
    """The figure's title, broken into lines at spaces where it is wider than the figure (a
    keyed model's title, with its id and key column, ran past both edges)."""
    import textwrap

    text = figure.suptitle(title)
    # Measured on the canvas: characters per line in proportion to the room left.
    renderer = figure.canvas.get_renderer()
    room = figure.bbox.width * 0.96
    width = text.get_window_extent(renderer).width
    if width > room:
        per_line = max(int(len(title) * room / width), 20)
        text.set_text(textwrap.fill(title, width=per_line, break_long_words=False))


def _colour(index: int) -> str:
    return COMPONENT_COLOURS[index % len(COMPONENT_COLOURS)]


def _png(draw: Any) -> bytes:
    """Run ``draw(figure)`` on a new Agg figure and return the PNG."""
    from matplotlib import rc_context
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # Names come from users (columns, targets, models): drawn as plain text, never parsed as
    # mathtext or TeX, where "$\\nosuchcommand{x}$" would fail the picture and "$...$" would
    # typeset as something the user did not write.
    with _render_lock, rc_context({"text.parse_math": False, "text.usetex": False}):
        figure = Figure(figsize=FIGURE_SIZE, dpi=DPI, layout="constrained")
        FigureCanvasAgg(figure)
        draw(figure)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _draw_loss_history(
    axes: Axes, loss_history: Sequence[float], *, n_iter: int, converged: bool | None
) -> None:
    state = "" if converged is None else ", converged" if converged else ", not converged"
    iterations = f"{n_iter} iteration{'s' if n_iter != 1 else ''}"
    axes.set_title(f"min-loss ({iterations}{state})")
    history = np.asarray(loss_history, dtype=np.float64)
    if history.size == 0:
        axes.text(0.5, 0.5, "no loss history", ha="center", va="center", transform=axes.transAxes)
        axes.set_axis_off()
        return
    from matplotlib.ticker import MaxNLocator

    if history.size == n_iter + 1:
        # The loss at the start, then after each iteration: the last point is iteration n_iter.
        steps, label = np.arange(history.size), "iteration (0: the start)"
    else:
        # A search's history (a point per batch of candidates, then its polish).
        steps, label = np.arange(1, history.size + 1), "step of the search"
    axes.plot(steps, history, color="#444444", marker=".")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel(label)
    axes.set_ylabel("min-loss")
    if np.all(history > 0) and history.max() > 10 * history.min():
        axes.set_yscale("log")
    axes.grid(alpha=0.3)


def _draw_bands(axes: Any, bands: ConfidenceBands, grid: FloatArray) -> None:
    """Shade, around each maximum-likelihood line, the pointwise ``level`` band of its value
    ``<[x, 1], line>``: standard deviation ``sqrt(d C d^T)`` with ``d = [x, 1]``."""
    x = np.linspace(grid[0], grid[-1], 60)
    design = np.column_stack([x, np.ones_like(x)])[:, : bands.lines.shape[1]]
    critical = float(ndtri(0.5 + bands.level / 2))
    centre = design @ bands.lines.T  # (points, k)
    spread = np.sqrt(np.einsum("np,kpq,nq->nk", design, bands.covariances, design))
    for line in range(bands.lines.shape[0]):
        axes.fill_between(
            x,
            centre[:, line] - critical * spread[:, line],
            centre[:, line] + critical * spread[:, line],
            color=_colour(line),
            alpha=0.25,
            linewidth=0,
        )


def render_model(picture: ModelPicture) -> bytes:
    """PNG of a model with its data.

    One feature: the rows and the k lines, each row coloured by its best line. Several
    features: each row's target against the prediction of its best line, coloured by that
    line. Beside it, the training loss per iteration.
    """
    X, y = picture.X, picture.y
    predictions = X @ picture.coef.T + picture.intercept
    best = np.argmin((predictions - y[:, np.newaxis]) ** 2, axis=1)
    k = picture.coef.shape[0]
    target = picture.target_name or "y"
    shown = f"{len(y):,} of {picture.n_rows:,} rows" if len(y) < picture.n_rows else ""

    def draw(figure: Any) -> None:
        data_axes, loss_axes = figure.subplots(1, 2, width_ratios=[3, 2])
        _suptitle(figure, picture.title)
        if X.shape[1] == 1:
            x = X[:, 0]
            grid = np.linspace(x.min(), x.max(), 2) if x.size else np.array([0.0, 1.0])
            for line in range(k):
                mine = best == line
                colour = _colour(line)
                data_axes.scatter(x[mine], y[mine], s=10, color=colour, linewidths=0)
                slope, offset = picture.coef[line, 0], picture.intercept[line]
                data_axes.plot(
                    grid,
                    slope * grid + offset,
                    color=colour,
                    linewidth=2,
                    label=f"line {line}: {slope:.3g}·x {offset:+.3g} "
                    f"({picture.shares[line]:.0%} of training rows)",
                )
            if picture.bands is not None:
                _draw_bands(data_axes, picture.bands, grid)
            data_axes.set_xlabel(picture.feature_names[0])
            data_axes.set_ylabel(target)
            data_axes.set_title(
                "rows coloured by their best line" + (f" ({shown})" if shown else "")
            )
        else:
            chosen = predictions[np.arange(len(y)), best]
            for line in range(k):
                mine = best == line
                data_axes.scatter(
                    y[mine],
                    chosen[mine],
                    s=10,
                    color=_colour(line),
                    linewidths=0,
                    label=f"line {line} ({picture.shares[line]:.0%} of training rows)",
                )
            if y.size:
                low, high = float(min(y.min(), chosen.min())), float(max(y.max(), chosen.max()))
                data_axes.plot([low, high], [low, high], color="#999999", linewidth=1)
            data_axes.set_xlabel(f"actual {target}")
            data_axes.set_ylabel("prediction of the best line")
            data_axes.set_title("actual vs best line" + (f" ({shown})" if shown else ""))
        data_axes.legend(loc="best", fontsize="small")
        data_axes.grid(alpha=0.3)
        _draw_loss_history(
            loss_axes, picture.loss_history, n_iter=picture.n_iter, converged=picture.converged
        )

    return _png(draw)


def render_sweep(picture: SweepPicture) -> bytes:
    """PNG of a k sweep: train and holdout min-loss against k, and BIC against k."""

    def draw(figure: Any) -> None:
        loss_axes, bic_axes = figure.subplots(1, 2)
        _suptitle(figure, picture.title)
        ks = picture.k_values
        loss_axes.plot(ks, picture.train_min_loss, marker="o", label="train", color=_colour(0))
        holdout = [np.nan if value is None else value for value in picture.holdout_min_loss]
        if not all(value is None for value in picture.holdout_min_loss):
            loss_axes.plot(ks, holdout, marker="s", label="holdout", color=_colour(1))
        values = [v for v in (*picture.train_min_loss, *holdout) if np.isfinite(v)]
        if values and min(values) > 0 and max(values) > 10 * min(values):
            loss_axes.set_yscale("log")
        loss_axes.set_xlabel("k (number of lines)")
        loss_axes.set_ylabel("min-loss")
        loss_axes.set_title("min-loss against k")
        loss_axes.legend(fontsize="small")
        bic_axes.plot(ks, picture.bic, marker="o", color=_colour(2))
        best = ks.index(picture.best_k)
        bic_axes.scatter(
            [picture.best_k],
            [picture.bic[best]],
            s=160,
            marker="*",
            color=_colour(3),
            zorder=3,
            label=f"lowest BIC: k={picture.best_k}",
        )
        bic_axes.set_xlabel("k (number of lines)")
        bic_axes.set_ylabel("BIC (lower is better)")
        bic_axes.set_title("BIC against k")
        bic_axes.legend(fontsize="small")
        for axes in (loss_axes, bic_axes):
            axes.set_xticks(ks)
            axes.grid(alpha=0.3)

    return _png(draw)


class PictureCache:
    """A small thread-safe LRU of rendered pictures; models never change once stored."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        """The cached PNG of ``key``, if any."""
        with self._lock:
            png = self._entries.get(key)
            if png is not None:
                self._entries.move_to_end(key)
            return png

    def put(self, key: str, png: bytes) -> None:
        """Keep ``png``, forgetting the least recently used picture when full."""
        with self._lock:
            self._entries[key] = png
            self._entries.move_to_end(key)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)
