"""``mixreg fit | predict | models | jobs | show | alias``: a user's commands, through the
client (``cancel`` and ``registered`` are in :mod:`mixreg_client.cli.registry`).

These commands talk to a running server over HTTP with :mod:`mixreg_client`, like any other
user's script; they never touch the database. Exit codes: 0 done; 1 the server refused the
request or the job failed or was cancelled; 2 a bad command line or an unreadable local file;
3 the server could not be reached; 130 interrupted with Ctrl-C.
"""

from __future__ import annotations

import argparse

from mixreg_client.cli.common import command
from mixreg_client.cli.fitting import parse_columns, parse_delimiter, parse_k, parse_param, run_fit
from mixreg_client.cli.predicting import run_predict
from mixreg_client.cli.showing import run_alias, run_jobs, run_models, run_show

# --- the parser ---


def _connection_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--url",
        help="the server (default: MIXREG_URL, else http://MIXREG_HOST:MIXREG_PORT)",
    )
    options.add_argument(
        "--api-key", help="sent as 'Authorization: Bearer KEY' (default: MIXREG_API_KEY)"
    )
    options.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait for each answer (60)"
    )
    return options


def _add_model_options(fit: argparse.ArgumentParser) -> None:
    """The options of ``POST /fit`` that shape the model: kept columns, weights, groups, a
    gate, a model per key, standard errors and the intercept."""
    fit.add_argument(
        "--keep",
        type=parse_columns,
        metavar="A,B,...",
        help="columns the upload keeps beside the features (never features), such as ids; "
        "the columns of --weights, --groups, --split-by and --gate are kept without it",
    )
    fit.add_argument("--weights", metavar="COLUMN", help="a number column of row weights")
    fit.add_argument(
        "--groups",
        metavar="COLUMN",
        help="a column of group labels: every row of a group on one line (auto, am-classic, em)",
    )
    fit.add_argument(
        "--gate",
        dest="gating",
        type=parse_columns,
        metavar="features|A,B,...",
        help="fit a gate, mixing probabilities that depend on each row: 'features' or the "
        "number columns it reads",
    )
    fit.add_argument(
        "--split-by",
        metavar="COLUMN",
        help="fit a mixture per value of this column (a key such as an account) in one job",
    )
    fit.add_argument(
        "--small-keys",
        choices=["k1", "skip"],
        help="with --split-by: what keys too small for k lines get (the server's default: k1)",
    )
    errors = fit.add_mutually_exclusive_group()
    errors.add_argument(
        "--standard-errors",
        action="store_true",
        default=None,
        help="compute the lines' standard errors (by default: up to 20,000 training rows)",
    )
    errors.add_argument(
        "--no-standard-errors",
        dest="standard_errors",
        action="store_false",
        help="compute none",
    )
    fit.add_argument(
        "--bootstrap",
        type=int,
        default=0,
        metavar="N",
        help="also N bootstrap refits for bootstrap standard errors and intervals",
    )
    fit.add_argument(
        "--bootstrap-kind",
        choices=["parametric", "empirical"],
        default="parametric",
        help="how the bootstrap draws its samples (parametric)",
    )
    fit.add_argument("--no-intercept", action="store_true", help="fit lines through the origin")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fit``, ``predict``, ``models``, ``jobs``, ``show`` and ``alias`` to the ``mixreg``
    command."""
    connection = _connection_options()

    fit = commands.add_parser(
        "fit",
        parents=[connection],
        help="upload a data file, fit k lines with a live progress bar, print the model",
        description="Upload DATA (.csv, .parquet or .npz), fit it on the server and follow the "
        "job with a progress bar; Ctrl-C asks whether to cancel the job.",
    )
    fit.add_argument("data", nargs="?", help="a .csv or .parquet file (with --target) or .npz")
    fit.add_argument("--dataset", metavar="ID", help="fit a stored dataset instead of a file")
    fit.add_argument("--target", help="the column to predict (CSV and Parquet files)")
    columns = fit.add_mutually_exclusive_group()
    columns.add_argument(
        "--features",
        type=parse_columns,
        metavar="A,B,...",
        help="the feature columns, in this order (default: every column but the target)",
    )
    columns.add_argument(
        "--ignore",
        type=parse_columns,
        metavar="A,B,...",
        help="columns to leave out, such as an id or a text column",
    )
    fit.add_argument(
        "--na",
        choices=["error", "drop"],
        default="error",
        help="what an empty feature or target cell does: error (default) stops the upload "
        "naming it, drop leaves its row out and says how many per column",
    )
    fit.add_argument(
        "--delimiter",
        help="what separates a CSV file's fields (default: the one of , ; tab | that its "
        "header holds most); 'tab' for a tab",
        type=parse_delimiter,
    )
    fit.add_argument(
        "--k",
        type=parse_k,
        required=True,
        help="the number of lines; a list (1,2,3) or range (1-4) fits each and BIC picks one",
    )
    fit.add_argument("--algorithm", default="auto", help="auto (default), am, am-classic, em, ...")
    fit.add_argument(
        "--param",
        type=parse_param,
        action="append",
        metavar="NAME=VALUE",
        help="an algorithm parameter, e.g. --param n_init=20 (repeatable)",
    )
    fit.add_argument("--seed", type=int, default=0, help="seeds the holdout split and the fit")
    fit.add_argument(
        "--holdout-fraction", type=float, default=0.2, help="share of rows held out (0.2)"
    )
    fit.add_argument("--time-budget", type=float, help="stop the search after this many seconds")
    fit.add_argument("--name", help="a name for the dataset, job and model")
    fit.add_argument(
        "--register",
        metavar="NAME",
        help="make the model the next version of registered model NAME",
    )
    fit.add_argument(
        "--init-model",
        metavar="MODEL",
        help="start from this model's lines (an id, name@alias or name/versions/N)",
    )
    _add_model_options(fit)
    output = fit.add_mutually_exclusive_group()
    output.add_argument("--no-wait", action="store_true", help="print the job id and return")
    output.add_argument("-q", "--quiet", action="store_true", help="print only the model id")
    output.add_argument("--json", action="store_true", help="print the job and model as JSON")
    fit.set_defaults(handler=command(run_fit))

    predict = commands.add_parser(
        "predict",
        parents=[connection],
        help="predict the rows of a CSV file: one column per component",
        description="Predict every row of DATA with MODEL: one column per component; when "
        "the target column is present, also the best component and its squared error.",
    )
    predict.add_argument("model", metavar="MODEL", help="a model id, name@alias or name/versions/N")
    predict.add_argument("data", metavar="DATA", help="a CSV file with the model's features")
    predict.add_argument("-o", "--output", help="write the CSV here (default: standard output)")
    predict.add_argument(
        "--target", help="the target column (default: the fitted dataset's, when present)"
    )
    predict.add_argument(
        "--keep",
        type=parse_columns,
        metavar="A,B,...",
        help="input columns to copy to each output row, such as ids to join on",
    )
    predict.set_defaults(handler=command(run_predict))

    models = commands.add_parser("models", parents=[connection], help="list the fitted models")
    models.add_argument("--limit", type=int, default=50, help="at most this many (50)")
    models.add_argument("--json", action="store_true", help="print JSON")
    models.set_defaults(handler=command(run_models))

    jobs = commands.add_parser("jobs", parents=[connection], help="list fit jobs and progress")
    jobs.add_argument("--status", choices=["queued", "running", "succeeded", "failed", "cancelled"])
    jobs.add_argument("--limit", type=int, default=20, help="at most this many (20)")
    jobs.add_argument("--json", action="store_true", help="print JSON")
    jobs.set_defaults(handler=command(run_jobs))

    show = commands.add_parser(
        "show", parents=[connection], help="show a model's lines and scores (or a job)"
    )
    show.add_argument(
        "id", metavar="MODEL", help="a model id, name@alias or name/versions/N (or a job id)"
    )
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(handler=command(run_show))

    alias = commands.add_parser(
        "alias",
        parents=[connection],
        help="point NAME@ALIAS at a version of a registered model (or show where it points)",
        description="Without VERSION, print the version NAME@ALIAS points at; with it, move "
        "the alias there (every server process follows within MIXREG_ALIAS_REFRESH_S).",
    )
    alias.add_argument("name", metavar="NAME", help="a registered model")
    alias.add_argument("alias", metavar="ALIAS", help="an alias, e.g. production")
    alias.add_argument("version", metavar="VERSION", type=int, nargs="?", help="a version")
    alias.set_defaults(handler=command(run_alias))

    # Imported here: the registry commands use this module's helpers.
    from mixreg_client.cli import registry

    registry.register(commands, connection)
