"""The web page's pictures agree with the model's record, and the page shows its jobs and
models a page at a time."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from service.api.ui import plots, routes


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """The figures the picture routes draw (kept instead of turned into PNG)."""
    figures: list[Figure] = []

    def keep(draw: Any) -> bytes:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        figure = Figure(figsize=plots.FIGURE_SIZE, dpi=plots.DPI, layout="constrained")
        FigureCanvasAgg(figure)
        draw(figure)
        figures.append(figure)
        return b"\x89PNG"

    monkeypatch.setattr(plots, "_png", keep)
    return figures


def fit(client, run_queued_jobs, X: np.ndarray, y: np.ndarray, **fields: Any) -> dict:
    body = {"data": {"X": X.tolist(), "y": y.tolist()}, "seed": 2, **fields}
    response = client.post("/fit", json=body)
    assert response.status_code == 202, response.text
    assert run_queued_jobs() == ["succeeded"]
    job = client.get(response.json()["url"]).json()
    model: dict = client.get(job["model_url"]).json()
    return model


@pytest.mark.parametrize("n_features", [1, 2], ids=["one-feature", "several"])
def test_a_models_picture_tells_its_record(
    client, run_queued_jobs, drawn, noisy_data, n_features: int
):
    X, y = noisy_data
    # Small data with a large holdout: shares over every row would differ from the record's.
    model = fit(
        client,
        run_queued_jobs,
        X[:30, :n_features],
        y[:30],
        k=3,
        holdout_fraction=0.5,
        algorithm="am",
    )
    assert client.get(f"/models/{model['id']}/plot.png").status_code == 200
    data_axes, loss_axes = drawn[-1].axes[:2]
    legend = [text.get_text() for text in data_axes.get_legend().get_texts()]
    shares = [component["share"] for component in model["components"]]
    assert len(legend) == 3
    for line, (label, share) in enumerate(zip(legend, shares, strict=True)):
        assert label.startswith(f"line {line}")
        assert label.endswith(f"({share:.0%} of training rows)")

    state = "converged" if model["converged"] else "not converged"
    iterations = f"{model['n_iter']} iteration{'s' if model['n_iter'] != 1 else ''}"
    assert loss_axes.get_title() == f"min-loss ({iterations}, {state})"
    steps = loss_axes.lines[0].get_xdata()
    # The start, then one point per iteration: the last point is the record's last iteration.
    assert steps[0] == 0 and steps[-1] == model["n_iter"]


def test_a_one_feature_picture_shades_the_confidence_band_of_each_line(
    client, run_queued_jobs, drawn
):
    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 2, size=200)
    y = np.where(rng.integers(0, 2, size=200), 2 * x + 3, -x - 3) + 0.5 * rng.standard_normal(200)
    model = fit(client, run_queued_jobs, x[:, None], y, k=2, algorithm="am-classic")
    assert client.get(f"/models/{model['id']}/plot.png").status_code == 200
    data_axes = drawn[-1].axes[0]
    bands = [item for item in data_axes.collections if isinstance(item, PolyCollection)]
    assert len(bands) == 2
    right = float(x.max())
    for band, component in zip(bands, model["components"], strict=True):
        estimates = component["estimates"]
        line = np.array([estimates["coef"][0]["estimate"], estimates["intercept"]["estimate"]])
        design = np.array([right, 1.0])
        centre = design @ line
        half = 1.959964 * np.sqrt(design @ np.array(estimates["covariance"]) @ design)
        vertices = band.get_paths()[0].vertices
        at_right = vertices[np.isclose(vertices[:, 0], right), 1]
        assert min(at_right) == pytest.approx(centre - half, rel=1e-4)
        assert max(at_right) == pytest.approx(centre + half, rel=1e-4)
        # The slope's variance sits on the covariance's diagonal, as its standard error says.
        slope_se = estimates["coef"][0]["std_error"]
        assert estimates["covariance"][0][0] == pytest.approx(slope_se**2)


def test_the_page_shows_jobs_and_models_a_page_at_a_time(
    client, run_queued_jobs, data, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(routes, "PAGE_MODELS", 2)
    monkeypatch.setattr(routes, "PAGE_JOBS", 2)
    X, y = data
    models = [fit(client, run_queued_jobs, X, y, k=2, name=f"fit {index}") for index in range(3)]
    newest, oldest = models[-1]["id"], models[0]["id"]

    first = client.get("/ui").text
    assert f"model-{newest}" in first and f"model-{oldest}" not in first
    assert "models 1 to 2 of 3 (page 1 of 2)" in first and 'href="?models_page=2"' in first
    second = client.get("/ui", params={"models_page": 2}).text
    assert f"model-{oldest}" in second and f"model-{newest}" not in second
    assert "models 3 to 3 of 3 (page 2 of 2)" in second
    assert "jobs 3 to 3 of 3" in client.get("/ui", params={"jobs_page": 2}).text
    assert client.get("/ui", params={"models_page": 0}).status_code == 422


def test_the_home_page_names_registered_models_their_versions_and_aliases(
    client, run_queued_jobs, data
):
    X, y = data
    first = fit(client, run_queued_jobs, X, y, k=2, registered_model="reco")
    second = fit(client, run_queued_jobs, X, y, k=2, registered_model="reco")
    plain = fit(client, run_queued_jobs, X, y, k=2)
    for alias, version in (("production", 1), ("staging", 2), ("champion", 2)):
        moved = client.put(f"/registered-models/reco/aliases/{alias}", json={"version": version})
        assert moved.status_code in (200, 201), moved.text
    page = client.get("/ui").text

    def card(model_id: str) -> str:
        start = page.index(f'id="model-{model_id}"')
        return page[start : page.index("</article>", start)]

    assert 'reco version 1 <span class="alias">@production</span></p>' in card(first["id"])
    assert (
        'reco version 2 <span class="alias">@champion</span> <span class="alias">@staging</span>'
        in card(second["id"])
    )
    assert 'class="registered"' not in card(plain["id"])


def test_a_keyed_models_long_title_stays_inside_its_picture(drawn):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((50, 2))
    title = (
        f"model {'a1' * 16}, global model of the keys of account_identifier: k=3, auto, "
        f"holdout min-loss 0.01234"
    )
    picture = plots.ModelPicture(
        title=title,
        coef=np.array([[1.0, 2.0], [-1.0, 0.5], [0.0, 1.0]]),
        intercept=np.zeros(3),
        feature_names=["a", "b"],
        target_name="rating",
        loss_history=[3.0, 2.0, 1.5],
        X=X,
        y=X @ [1.0, 2.0],
        n_rows=50,
        shares=np.array([0.5, 0.3, 0.2]),
        n_iter=2,
        converged=True,
    )
    plots.render_model(picture)
    figure = drawn[-1]
    figure.canvas.draw()
    suptitle = figure.get_suptitle()
    # Every word kept, on lines that fit.
    assert suptitle.split() == title.split() and "\n" in suptitle
    extent = figure._suptitle.get_window_extent(figure.canvas.get_renderer())
    assert extent.x0 >= 0 and extent.x1 <= figure.bbox.width
