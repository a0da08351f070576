"""The console script covers what a user does over HTTP: fits with kept columns, weights,
groups, a gate, a model per key and standard errors; ``show`` tells keyed, gated and
registered models apart; ``models`` and ``registered`` list registered names, versions and
aliases; ``cancel`` stops a job. The client's ``Job``, ``Model`` and ``Progress`` carry the
keyed fields."""

from __future__ import annotations

import csv
import io
import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mixreg_client import Client, KeyedSummary

from .conftest import Server, mixture_data
from .test_e2e_cli import FAST, LONG_FIT_PARAMS, LONG_FITS_ALLOWED, mixreg

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server (SQLite) for the tests of this module."""
    folder = tmp_path_factory.mktemp("cli-models")
    server = Server(
        database_url=f"sqlite:///{folder / 'mixreg.db'}",
        log_path=folder / "server.log",
        settings=LONG_FITS_ALLOWED,
    )
    server.start()
    yield server
    server.stop()
    server.client.close()


def write_table(path: Path, columns: dict[str, list]) -> Path:
    """A CSV file of the named columns."""
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(columns)
        writer.writerows(zip(*columns.values(), strict=True))
    return path


def model_id_of(result) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_a_keyed_fit_from_the_command_line_and_what_show_says(live: Server, tmp_path: Path):
    X, y = mixture_data(n_rows=600, seed=2)
    accounts = [f"acct-{index % 4}" for index in range(len(y))]
    data = write_table(
        tmp_path / "ratings.csv",
        {
            "row_id": [f"r{index}" for index in range(len(y))],
            "account": accounts,
            "a": X[:, 0].tolist(),
            "b": X[:, 1].tolist(),
            "c": X[:, 2].tolist(),
            "y": y.tolist(),
        },
    )
    fitted = mixreg(
        "fit", str(data), "--target", "y", "--k", "2", "--split-by", "account",
        "--keep", "row_id", "-q", *FAST, url=live.base_url,
    )  # fmt: skip
    model_id = model_id_of(fitted)
    served = live.request("GET", f"/models/{model_id}").json()
    assert served["split_by"] == "account"
    dataset = live.request("GET", f"/datasets/{served['dataset_id']}").json()
    # The key and the --keep column are kept beside the features, never features.
    assert dataset["feature_names"] == ["a", "b", "c"]
    assert {column["name"] for column in dataset["columns"]} == {"row_id", "account"}

    shown = mixreg("show", model_id, url=live.base_url)
    assert shown.returncode == 0, shown.stderr
    statuses = served["keyed"]["keys_by_status"]
    assert f"split by          account: 4 keys ({statuses['fitted']:,} fitted" in shown.stdout
    assert "keyed rows        600" in shown.stdout
    assert "global line 0" in shown.stdout and "global line 1" in shown.stdout
    listed = mixreg("models", url=live.base_url)
    row = next(line for line in listed.stdout.splitlines() if model_id in line)
    assert "account" in row

    with Client(live.base_url) as client:
        model = client.get_model(model_id)
        job = client.get_job(served["job_id"])
    assert model.split_by == "account" and isinstance(model.keyed, KeyedSummary)
    assert model.keyed.n_keys == 4 and model.keyed.keys_by_status == statuses
    assert job.split_by == "account" and job.keyed == model.keyed
    assert (job.progress.keys_done, job.progress.n_keys) == (4, 4)


def test_a_gated_fit_with_standard_errors_shows_the_gated_bic(live: Server, tmp_path: Path):
    rng = np.random.default_rng(4)
    n = 400
    z = rng.standard_normal(n)
    x = rng.standard_normal(n)
    # The line a row follows depends on z: the gate has something to find.
    line = (z + 0.3 * rng.standard_normal(n) > 0).astype(int)
    y = np.where(line == 1, 2.0 * x + 1.0, -1.5 * x - 1.0) + 0.1 * rng.standard_normal(n)
    data = write_table(
        tmp_path / "gated.csv",
        {
            "x": x.tolist(),
            "z": z.tolist(),
            "y": y.tolist(),
        },
    )
    fitted = mixreg(
        "fit", str(data), "--target", "y", "--k", "2", "--algorithm", "em", "--gate", "z",
        "--standard-errors", "-q", url=live.base_url,
    )  # fmt: skip
    model_id = model_id_of(fitted)
    served = live.request("GET", f"/models/{model_id}").json()
    assert served["gate"]["concomitant"] == ["z"]
    assert served["uncertainty"] is not None
    gated_bic, plain_bic = served["gate"]["bic"], served["bic"]
    assert f"{gated_bic:.6g}" != f"{plain_bic:.6g}"

    shown = mixreg("show", model_id, url=live.base_url)
    assert shown.returncode == 0, shown.stderr
    assert f"BIC               {gated_bic:.6g} (of the gated mixture)" in shown.stdout
    assert f"{plain_bic:.6g}" not in shown.stdout
    assert "gate              softmax over lines of logits of z" in shown.stdout
    assert re.search(r"gate 0 +logit = 0·z \+ 0 +\(reference\)", shown.stdout), shown.stdout
    assert "gate 1" in shown.stdout

    with Client(live.base_url) as client:
        model = client.get_model(model_id)
    assert model.gated_bic == gated_bic
    printed = str(model.summary())
    assert "maximum-likelihood estimates of the gated mixture: the lines it serves" in printed


def test_a_grouped_weighted_fit_and_an_ungated_summary_names_its_fit(live: Server, tmp_path: Path):
    X, y = mixture_data(n_rows=300, seed=5)
    data = write_table(
        tmp_path / "grouped.csv",
        {
            "g": [f"g{index // 3}" for index in range(len(y))],
            "w": np.random.default_rng(1).uniform(0.5, 2.0, len(y)).round(3).tolist(),
            "a": X[:, 0].tolist(),
            "b": X[:, 1].tolist(),
            "c": X[:, 2].tolist(),
            "y": y.tolist(),
        },
    )
    fitted = mixreg(
        "fit", str(data), "--target", "y", "--k", "2", "--algorithm", "em", "--groups", "g",
        "--weights", "w", "--no-standard-errors", "-q", url=live.base_url,
    )  # fmt: skip
    served = live.request("GET", f"/models/{model_id_of(fitted)}").json()
    assert (served["groups"], served["weights"], served["uncertainty"]) == ("g", "w", None)

    data = write_table(
        tmp_path / "plain.csv",
        {"a": X[:, 0].tolist(), "b": X[:, 1].tolist(), "c": X[:, 2].tolist(), "y": y.tolist()},
    )
    fitted = mixreg(
        "fit", str(data), "--target", "y", "--k", "2", "--standard-errors", "--no-intercept",
        "-q", *FAST, url=live.base_url,
    )  # fmt: skip
    model_id = model_id_of(fitted)
    with Client(live.base_url) as client:
        model = client.get_model(model_id)
    assert model.fit_intercept is False
    assert "not the served min-loss lines" in str(model.summary())


def test_registered_models_versions_and_aliases_from_the_command_line(live: Server, tmp_path: Path):
    data = tmp_path / "data.csv"
    X, y = mixture_data(n_rows=150, seed=8)
    write_table(
        data,
        {"a": X[:, 0].tolist(), "b": X[:, 1].tolist(), "c": X[:, 2].tolist(), "y": y.tolist()},
    )
    versions = [
        model_id_of(
            mixreg(
                "fit",
                str(data),
                "--target",
                "y",
                "--k",
                "2",
                "--register",
                "reco",
                "-q",
                *FAST,
                url=live.base_url,
            )
        )
        for _ in range(2)
    ]
    moved = mixreg("alias", "reco", "production", "1", url=live.base_url)
    assert moved.returncode == 0, moved.stderr
    assert mixreg("alias", "reco", "staging", "2", url=live.base_url).returncode == 0

    registered = mixreg("registered", url=live.base_url)
    assert registered.returncode == 0, registered.stderr
    row = next(line for line in registered.stdout.splitlines() if "reco" in line)
    assert "production -> 1, staging -> 2" in row and re.search(r"\breco\b.*\b2\b", row)

    listed = mixreg("registered", "reco", url=live.base_url)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[1]: line for line in listed.stdout.splitlines() if versions[0] in line}
    assert "production" in next(iter(rows.values()))
    assert any("staging" in line and versions[1] in line for line in listed.stdout.splitlines())

    models = mixreg("models", url=live.base_url)
    first = next(line for line in models.stdout.splitlines() if versions[0] in line)
    second = next(line for line in models.stdout.splitlines() if versions[1] in line)
    assert "reco/1" in first and "production" in first and "staging" not in first
    assert "reco/2" in second and "staging" in second

    shown = mixreg("show", "reco@production", url=live.base_url)
    assert shown.returncode == 0, shown.stderr
    assert "version           reco/versions/1, reco@production" in shown.stdout


def test_cancel_stops_a_running_job(live: Server, tmp_path: Path):
    X, y = mixture_data(n_rows=400)
    data = write_table(
        tmp_path / "long.csv",
        {"a": X[:, 0].tolist(), "b": X[:, 1].tolist(), "c": X[:, 2].tolist(), "y": y.tolist()},
    )
    started = mixreg(
        "fit", str(data), "--target", "y", "--k", "2", "--algorithm", "subsample",
        "--param", f"n_partitions={LONG_FIT_PARAMS['n_partitions']}",
        "--param", "subsample_size=30", "--time-budget", "3000", "--no-wait",
        url=live.base_url,
    )  # fmt: skip
    job_id = model_id_of(started)
    deadline = time.monotonic() + 60
    while live.job(job_id)["status"] != "running":
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.2)
    cancelled = mixreg("cancel", job_id, url=live.base_url)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith(f"job {job_id} ")
    deadline = time.monotonic() + 60
    while live.job(job_id)["status"] != "cancelled":
        assert time.monotonic() < deadline, live.job(job_id)
        time.sleep(0.2)
    again = mixreg("cancel", job_id, url=live.base_url)
    assert again.returncode == 0
    assert again.stdout.strip() == f"job {job_id} cancelled"
    unknown = mixreg("cancel", "f" * 32, url=live.base_url)
    assert unknown.returncode == 1 and "404" in unknown.stderr


def test_a_dataframe_upload_keeps_its_target_name_for_predict_by_alias(
    live: Server, tmp_path: Path
):
    pd = pytest.importorskip("pandas")
    X, y = mixture_data(n_rows=150, seed=6)
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    frame["rating"] = y
    frame["user"] = [f"u{index}" for index in range(len(y))]
    with Client(live.base_url) as client:
        dataset = client.upload(frame, target="rating", keep=["user"])
        assert dataset.target_name == "rating" and dataset.feature_names == ["a", "b", "c"]
        job = client.fit(dataset, k=2, registered_model="ratings", params={"n_init": 4})
        job.wait(timeout=120)
        client.set_alias("ratings", "production", 1)
    data = tmp_path / "ratings.csv"
    frame.to_csv(data, index=False)
    predicted = mixreg(
        "predict", "ratings@production", str(data), "--keep", "user", url=live.base_url
    )
    assert predicted.returncode == 0, predicted.stderr
    header = predicted.stdout.splitlines()[0]
    assert header == "user,component_0,component_1,best,min_loss"

    # The name of y cannot be a feature's.
    body = io.BytesIO()
    np.savez(body, X=X, y=y, feature_names=np.array(["a", "b", "c"]))
    refused = live.request(
        "POST",
        "/datasets",
        files={"file": ("data.npz", body.getvalue(), "application/x-npz")},
        data={"target": "b"},
    )
    assert refused.status_code == 422, refused.text
    assert "target 'b' names the NPZ's array y" in refused.json()["detail"]
