"""The user's commands of the ``mixreg`` console script against a real server: fit with a live
progress bar, predict a CSV, list and show; exit codes and one-line messages; Ctrl-C."""

from __future__ import annotations

import csv
import json
import os
import pty
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mixreg_client import Client

from .conftest import REPO, Server, mixture_data, module_sqlite_server

pytestmark = pytest.mark.e2e

# A sub-sample search with far more partitions than it can try runs until it is cancelled.
LONG_FITS_ALLOWED = {"MIXREG_MAX_N_PARTITIONS": str(10**9)}
LONG_FIT_PARAMS = {"n_partitions": 10**9, "subsample_size": 30}

MIXREG = REPO / ".venv" / "bin" / "mixreg"
FAST = ["--param", "n_init=4", "--param", "n_partitions=50", "--param", "subsample_size=30"]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server (SQLite) for the tests of this module."""
    yield from module_sqlite_server(tmp_path_factory, "cli", **LONG_FITS_ALLOWED)


def mixreg(*args: str, url: str | None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if key != "MIXREG_URL"}
    if url is not None:
        environment["MIXREG_URL"] = url
    return subprocess.run(
        [str(MIXREG), *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=timeout,
        check=False,
    )


def write_csv(path: Path, X: np.ndarray, y: np.ndarray | None, names=("a", "b", "c")) -> Path:
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow([*names, *(["y"] if y is not None else [])])
        for index, row in enumerate(X):
            writer.writerow(
                [repr(float(v)) for v in row] + ([repr(float(y[index]))] if y is not None else [])
            )
    return path


def test_fit_predict_list_and_show(live: Server, tmp_path: Path):
    X, y = mixture_data(n_rows=150, seed=9)
    data = write_csv(tmp_path / "data.csv", X, y)

    fitted = mixreg(
        "fit", str(data), "--target", "y", "--k", "2", "--seed", "4", *FAST, url=live.base_url
    )
    assert fitted.returncode == 0, fitted.stderr
    model_id = re.search(r"^model ([0-9a-f]{32})$", fitted.stdout, re.MULTILINE)
    assert model_id is not None, fitted.stdout
    model_id = model_id.group(1)
    model = live.request("GET", f"/models/{model_id}").json()
    assert f"holdout min-loss  {model['holdout_min_loss']:.4g}" in fitted.stdout
    assert "line 0            y = " in fitted.stdout and "line 1" in fitted.stdout
    # The progress bar went to standard error and reached the end.
    assert "100%" in fitted.stderr and "succeeded" in fitted.stderr

    output = tmp_path / "predictions.csv"
    predicted = mixreg("predict", model_id, str(data), "-o", str(output), url=live.base_url)
    assert predicted.returncode == 0, predicted.stderr
    with output.open() as file:
        rows = list(csv.reader(file))
    assert rows[0] == ["component_0", "component_1", "best", "min_loss"]
    values = np.array([[float(cell) for cell in row] for row in rows[1:]])
    served = live.request(
        "POST", f"/models/{model_id}/predict", json={"X": X.tolist(), "y": y.tolist()}
    ).json()
    np.testing.assert_array_equal(values[:, :2], np.array(served["predictions"]))
    np.testing.assert_array_equal(values[:, 2], served["best_component"])
    assert values[:, 3].mean() == pytest.approx(served["min_loss"], rel=1e-12)
    assert f"wrote 150 rows x 2 components to {output}" in predicted.stderr

    # Without the target column: one column per component, to standard output.
    features_only = write_csv(tmp_path / "features.csv", X[:3], None)
    printed = mixreg("predict", model_id, str(features_only), url=live.base_url)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.splitlines()[0] == "component_0,component_1"
    assert len(printed.stdout.splitlines()) == 4

    listed = mixreg("models", url=live.base_url)
    assert listed.returncode == 0 and model_id in listed.stdout
    jobs = mixreg("jobs", url=live.base_url)
    assert jobs.returncode == 0 and "succeeded" in jobs.stdout and model_id in jobs.stdout
    shown = mixreg("show", model_id, url=live.base_url)
    assert shown.returncode == 0 and shown.stdout.startswith(f"model {model_id}")


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["show", "f" * 32], 1, "no model or job has the id ffff"),
        (["predict", "f" * 32, "{data}"], 1, f"model {'f' * 32} does not exist (404 Not Found)"),
        (
            ["fit", "{data}", "--k", "2"],
            2,
            "name the column to predict with --target; {data} has the columns a, b, c, y",
        ),
        (
            ["fit", "{bad}", "--target", "y", "--k", "2"],
            2,
            "{bad}: CSV line 3, column 'b': 'oops' is not a number",
        ),
        (
            ["fit", "{data}", "--target", "y", "--k", "0"],
            1,
            "k: Input should be greater than or equal to 1 (422 Unprocessable Entity)",
        ),
    ],
)
def test_failures_exit_non_zero_with_one_line(live: Server, tmp_path: Path, args, code, message):
    data = write_csv(tmp_path / "data.csv", *mixture_data(n_rows=20))
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b,y\n1,2,3\n4,oops,6\n")
    args = [arg.format(data=data, bad=bad) for arg in args]
    result = mixreg(*args, url=live.base_url)
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("mixreg: ") and message.format(data=data, bad=bad) in lines[0]


def test_an_unreachable_server_exits_3_naming_the_url():
    result = mixreg("models", "--url", "http://127.0.0.1:9", url=None)
    assert result.returncode == 3
    assert result.stderr.startswith("mixreg: cannot reach the mixreg server at http://127.0.0.1:9")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "set its address with MIXREG_URL, or MIXREG_HOST and MIXREG_PORT, or give --url" in (
        result.stderr
    )


def test_a_k_range_far_above_the_limit_is_summarized(live: Server, tmp_path: Path):
    data = write_csv(tmp_path / "data.csv", *mixture_data(n_rows=20))
    result = mixreg("fit", str(data), "--target", "y", "--k", "1-500", url=live.base_url)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and len(result.stderr) < 300, result.stderr
    assert "k lists 500 values; a sweep fits at most 20 (MIXREG_MAX_K_SWEEP)" in result.stderr
    assert (
        "k[100] = 101 … k[499] = 500: 400 values are above the limit of 100 (MIXREG_MAX_K)"
        in result.stderr
    )


def read_until(fd: int, pattern: str, timeout: float) -> str:
    """Read the terminal until ``pattern`` appears (or fail after ``timeout`` seconds)."""
    seen = ""
    deadline = time.monotonic() + timeout
    while pattern not in seen:
        assert time.monotonic() < deadline, f"never saw {pattern!r} in:\n{seen}"
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the terminal closed: the program exited
            break
        seen += chunk.decode(errors="replace")
    return seen


def _sigint_as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_ctrl_c_asks_and_cancels_the_job(live: Server, tmp_path: Path):
    data = write_csv(tmp_path / "data.csv", *mixture_data(n_rows=400))
    primary, secondary = pty.openpty()
    environment = {**os.environ, "MIXREG_URL": live.base_url, "COLUMNS": "120"}
    process = subprocess.Popen(
        [
            str(MIXREG),
            "fit",
            str(data),
            "--target",
            "y",
            "--k",
            "2",
            "--algorithm",
            "subsample",
            "--param",
            f"n_partitions={LONG_FIT_PARAMS['n_partitions']}",
            "--param",
            "subsample_size=30",
            "--time-budget",
            "3000",
        ],
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        env=environment,
        start_new_session=True,
        # As in a terminal: Ctrl-C delivered and handled, whatever the test process inherited
        # (a signal ignored or blocked by an earlier test in the same worker would carry over).
        preexec_fn=_sigint_as_in_a_terminal,
    )
    os.close(secondary)
    try:
        # A terminal gets the live bar; wait until the fit runs.
        screen = read_until(primary, "running", timeout=60)
        job_id = live.request("GET", "/jobs", params={"status": "running"}).json()["items"][0]["id"]
        assert f"job {job_id[:8]}" in screen
        process.send_signal(signal.SIGINT)
        prompt = f"Cancel job {job_id}? [y/N]"
        try:
            read_until(primary, prompt, timeout=10)
        except AssertionError:
            # A first Ctrl-C has gone unanswered on a loaded machine (CI, twice in ~10 runs;
            # the cause is not found): a user presses it again, and so does this test.
            process.send_signal(signal.SIGINT)
            read_until(primary, prompt, timeout=30)
        os.write(primary, b"y\n")
        assert process.wait(timeout=60) == 130
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(primary)
    assert live.job(job_id)["status"] == "cancelled"


def test_db_downgrade_needs_a_revision_and_yes_for_base(tmp_path: Path):
    database = tmp_path / "mixreg.db"
    environment = {**os.environ, "MIXREG_DATABASE_URL": f"sqlite:///{database}"}

    def db(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(MIXREG), "db", *args],
            capture_output=True,
            text=True,
            env=environment,
            timeout=60,
            check=False,
        )

    assert db("upgrade").returncode == 0
    head = db("current").stdout.split()[0]

    no_revision = db("downgrade")
    assert no_revision.returncode == 2
    assert "revision" in no_revision.stderr
    unconfirmed = db("downgrade", "base")
    assert unconfirmed.returncode == 2
    assert "--yes" in unconfirmed.stderr
    assert db("current").stdout.split()[0] == head  # nothing was dropped

    one_step = db("downgrade", "-1")
    assert one_step.returncode == 0, one_step.stderr
    assert db("current").stdout.split()[0] != head
    confirmed = db("downgrade", "base", "--yes")
    assert confirmed.returncode == 0, confirmed.stderr
    assert confirmed.stdout == "database at revision None\n"


def test_fit_chooses_columns_and_reads_semicolons(live: Server, tmp_path: Path):
    X, y = mixture_data(n_rows=40, seed=5)
    export = tmp_path / "export.csv"
    lines = ["id;a;b;comment;c;y"] + [
        f"row-{i};{a!r};{b!r};text {i};{c!r};{t!r}"
        for i, ((a, b, c), t) in enumerate(zip(X.tolist(), y.tolist(), strict=True))
    ]
    export.write_text("\n".join(lines) + "\n")
    result = mixreg(
        "fit",
        str(export),
        "--target",
        "y",
        "--ignore",
        "id,comment",
        "--k",
        "2",
        *FAST,
        "--json",
        url=live.base_url,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["model"]["feature_names"] == ["a", "b", "c"]

    chosen = mixreg(
        "fit",
        str(export),
        "--target",
        "y",
        "--features",
        "c,a",
        "--k",
        "2",
        *FAST,
        "--json",
        url=live.base_url,
    )
    assert chosen.returncode == 0, chosen.stderr
    assert json.loads(chosen.stdout)["model"]["feature_names"] == ["c", "a"]

    wrong = mixreg(
        "fit", str(export), "--target", "y", "--delimiter", ",", "--k", "2", url=live.base_url
    )
    assert wrong.returncode == 2
    assert wrong.stderr.strip() == (
        f"mixreg: {export}: CSV has no column 'y'; columns are id;a;b;comment;c;y (the header "
        f"looks separated by ';': give the delimiter, --delimiter ';')"
    )


def test_predict_of_many_rows_with_the_target_is_linear_and_keeps_id_columns(
    live: Server, tmp_path: Path
):
    n_rows = 200_000
    X, y = mixture_data(n_rows=n_rows, seed=21)
    path = tmp_path / "ratings.csv"
    # Ids and a title with a comma, to be copied to the output rows as they are.
    ids = np.char.add("u", np.arange(n_rows).astype(str))
    rows = np.column_stack([X, y]).tolist()
    with path.open("w", newline="") as file:
        file.write("user_id,title,a,b,c,y\n")
        file.writelines(
            f'{ids[i]},"Film, part {i % 7}",{",".join(map(repr, row))}\n'
            for i, row in enumerate(rows)
        )
    output = tmp_path / "predictions.csv"
    command = ["predict", "", str(path), "-o", str(output), "--target", "y",
               "--keep", "user_id,title"]  # fmt: skip
    with Client(live.base_url) as client:
        dataset = client.upload(X[:300], y[:300], feature_names=["a", "b", "c"])
        model_id = client.fit(dataset, k=2, params={"n_init": 4}, seed=2).wait().model_id
        assert model_id is not None
        model = client.get_model(model_id)
        command[1] = model_id
        served = client.score(model, X, y)
        # Other tests' fits (a cancelled one) must not share the CPU with one side only.
        deadline = time.monotonic() + 60
        while any(client.list_jobs(status=status) for status in ("queued", "running")):
            assert time.monotonic() < deadline, "the server's jobs did not finish"
            time.sleep(0.2)
        # Each side twice, taking turns, so a burst of other load costs both; the best of each.
        client_times, cli_times = [], []
        for _ in range(2):
            started = time.perf_counter()
            client.predict(model, X)
            client_times.append(time.perf_counter() - started)
            started = time.perf_counter()
            predicted = mixreg(*command, url=live.base_url)
            cli_times.append(time.perf_counter() - started)
            assert predicted.returncode == 0, predicted.stderr
        client_s, cli_s = min(client_times), min(cli_times)
    assert predicted.returncode == 0, predicted.stderr

    with output.open(newline="") as file:
        rows = list(csv.reader(file))
    assert rows[0] == ["user_id", "title", "component_0", "component_1", "best", "min_loss"]
    assert len(rows) == n_rows + 1
    assert rows[1][:2] == ["u0", "Film, part 0"]
    assert rows[-1][:2] == [f"u{n_rows - 1}", f"Film, part {(n_rows - 1) % 7}"]
    values = np.array([row[2:] for row in rows[1:]], dtype=np.float64)
    np.testing.assert_array_equal(values[:, :2], served.predictions)
    np.testing.assert_array_equal(values[:, 2], served.best_component)
    np.testing.assert_array_equal(values[:, 3], served.row_min_loss)
    # The whole command (start, read, score, write) against the client's own call.
    # Linear: three times the client's own predict, plus a second for the console script's
    # start and its CSV read and write (a row-by-row loss took 16 s on 50,000 rows).
    assert cli_s < 3 * client_s + 1.0, f"mixreg predict {cli_s:.2f} s, client {client_s:.2f} s"
