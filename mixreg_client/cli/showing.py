"""``mixreg models | jobs | show | alias``: models and jobs as tables and as text."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from mixreg_client import Client, Job, MixregError, Model, ModelSummary
from mixreg_client.cli.common import EXIT_OK, connect, format_number, stdout_console


def run_alias(args: argparse.Namespace) -> int:
    with connect(args) as client:
        if args.version is None:
            alias = client.get_alias(args.name, args.alias)
            print(f"{alias.reference} -> version {alias.version} (model {alias.model_id})")
            return EXIT_OK
        alias = client.set_alias(args.name, args.alias, args.version)
    before = "new" if alias.previous_version is None else f"was version {alias.previous_version}"
    print(f"{alias.reference} -> version {alias.version} (model {alias.model_id}; {before})")
    return EXIT_OK


def _line_equation(model: Model, index: int) -> str:
    component = model.components[index]
    terms = [
        f"{coef:.4g}·{name}" for coef, name in zip(component.coef, model.feature_names, strict=True)
    ]
    if model.fit_intercept:
        terms.append(f"{component.intercept:.4g}")
    return "y = " + " + ".join(terms).replace("+ -", "- ")


def _aliases_of(client: Client, model: ModelSummary) -> list[str]:
    """The aliases that point at a registered model's version (none for other models)."""
    if model.registered_model is None:
        return []
    registered = client.get_registered_model(model.registered_model)
    return sorted(
        alias for alias, version in registered.aliases.items() if version == model.version
    )


def print_model(
    console: Console, model: Model, *, job: Job | None = None, aliases: Sequence[str] = ()
) -> None:
    console.print(f"model {model.id}")
    if model.registered_model is not None:
        pointed = "".join(f", {model.registered_model}@{alias}" for alias in aliases)
        console.print(
            f"  version           {model.registered_model}/versions/{model.version}{pointed}"
        )
    if job is not None:
        console.print(f"  job               {job.id} ({job.status})")
    console.print(
        f"  algorithm         {model.algorithm}, k={model.n_components}, seed {model.seed}"
    )
    console.print(f"  rows              {model.n_train} training, {model.n_holdout} held out")
    console.print(f"  train min-loss    {format_number(model.train_min_loss)}")
    baseline = model.baseline_holdout_min_loss
    if baseline is None:
        baseline = model.baseline_train_min_loss
    verdict = "beats it" if model.beats_baseline else "does not beat it"
    console.print(
        f"  holdout min-loss  {format_number(model.holdout_min_loss)}"
        f"   (one-line baseline {format_number(baseline)}: {verdict})"
    )
    if model.gate is None:
        console.print(f"  BIC               {format_number(model.bic, 6)}")
    else:
        console.print(
            f"  BIC               {format_number(model.gated_bic, 6)} (of the gated mixture)"
        )
    if model.split_by is not None:
        _print_keys(console, model)
    title = "global line" if model.split_by is not None else "line"
    for index, component in enumerate(model.components):
        share = "gate's mean probability" if model.gate is not None else "share"
        console.print(
            f"  {f'{title} {index}':<18}{_line_equation(model, index)}"
            f"   ({share} {component.share:.2f})"
        )
    if model.gate is not None:
        _print_gate(console, model, model.gate)
    for warning in model.warnings:
        console.print(f"  warning           {warning}")


def _print_keys(console: Console, model: Model) -> None:
    """A keyed model's key column and its keys by status."""
    keyed = model.keyed
    if keyed is None:
        console.print(f"  split by          {model.split_by}")
        return
    statuses = ", ".join(f"{count:,} {status}" for status, count in keyed.keys_by_status.items())
    console.print(f"  split by          {model.split_by}: {keyed.n_keys:,} keys ({statuses})")
    without = f", {keyed.rows_without_key:,} without a key" if keyed.rows_without_key else ""
    console.print(f"  keyed rows        {keyed.n_rows:,}{without}")
    quantiles = keyed.min_loss_quantiles
    if quantiles:
        spread = ", ".join(f"{name} {format_number(value)}" for name, value in quantiles.items())
        console.print(f"  keys' min-loss    {spread}")


def _print_gate(console: Console, model: Model, gate: Mapping[str, Any]) -> None:
    """A gated model's gate: each line's logit, against the first line (the reference)."""
    columns = gate.get("concomitant") or model.feature_names
    console.print(f"  gate              softmax over lines of logits of {', '.join(columns)}")
    for index, (coef, intercept) in enumerate(zip(gate["coef"], gate["intercept"], strict=True)):
        terms = [f"{value:.4g}·{name}" for value, name in zip(coef, columns, strict=True)]
        logit = " + ".join([*terms, f"{intercept:.4g}"]).replace("+ -", "- ")
        reference = "   (reference)" if index == 0 else ""
        console.print(f"  gate {index:<13}logit = {logit}{reference}")


def print_sweep(console: Console, job: Job) -> None:
    assert job.sweep is not None
    table = Table(title=f"k sweep of job {job.id}", title_justify="left")
    for column in ("k", "train min-loss", "holdout min-loss", "BIC", "beats baseline", "model"):
        table.add_column(column, no_wrap=True)
    for entry in job.sweep.models:
        best = entry.n_components == job.sweep.best_n_components
        table.add_row(
            f"{entry.n_components}{' *' if best else ''}",
            format_number(entry.train_min_loss),
            format_number(entry.holdout_min_loss),
            format_number(entry.bic, 6),
            "yes" if entry.beats_baseline else "no",
            entry.model_id,
        )
    console.print(table)
    console.print(f"BIC prefers k={job.sweep.best_n_components} (*)")


def run_models(args: argparse.Namespace) -> int:
    with connect(args) as client:
        models = client.list_models(limit=args.limit)
        # Where each registered model's aliases point, read once per registered model.
        aliases: dict[str, dict[str, int]] = {}
        for model in models:
            name = model.registered_model
            if name is not None and name not in aliases:
                aliases[name] = client.get_registered_model(name).aliases
    if args.json:
        print(json.dumps([model.raw for model in models], indent=2))
        return EXIT_OK
    table = Table()
    for column in ("id", "name", "registered", "aliases", "algorithm", "k", "split by"):
        table.add_column(column, no_wrap=True)
    for column in ("holdout min-loss", "beats baseline", "BIC", "created"):
        table.add_column(column, no_wrap=True)
    for model in models:
        pointing = aliases.get(model.registered_model or "", {})
        table.add_row(*_model_row(model, pointing))
    stdout_console().print(table if models else "no models yet")
    return EXIT_OK


def _model_row(model: ModelSummary, aliases: Mapping[str, int]) -> list[str]:
    registered = (
        "" if model.registered_model is None else f"{model.registered_model}/{model.version}"
    )
    return [
        model.id,
        model.name or "",
        registered,
        ",".join(sorted(alias for alias, version in aliases.items() if version == model.version)),
        model.algorithm,
        str(model.n_components),
        model.split_by or "",
        format_number(model.holdout_min_loss),
        "yes" if model.beats_baseline else "no",
        format_number(model.bic, 6),
        model.created_at[:19].replace("T", " "),
    ]


def run_jobs(args: argparse.Namespace) -> int:
    with connect(args) as client:
        jobs = client.list_jobs(status=args.status, limit=args.limit)
    if args.json:
        print(json.dumps([job.raw for job in jobs], indent=2))
        return EXIT_OK
    table = Table()
    for column in ("id", "status", "progress", "best min-loss", "algorithm", "k", "model"):
        table.add_column(column, no_wrap=True)
    table.add_column("created", no_wrap=True)
    for job in jobs:
        k = ",".join(map(str, job.k_values)) if job.k_values else str(job.n_components)
        table.add_row(
            job.id,
            job.status,
            f"{job.progress.fraction:.0%}",
            format_number(job.progress.best_min_loss),
            job.algorithm,
            k,
            job.model_id or "",
            job.created_at[:19].replace("T", " "),
        )
    stdout_console().print(table if jobs else "no jobs yet")
    return EXIT_OK


def run_show(args: argparse.Namespace) -> int:
    with connect(args) as client:
        try:
            model = client.get_model(args.id)
        except MixregError as exc:
            if exc.status != 404:
                raise
            job = _job_or_none(client, args.id)
            if job is None:
                raise MixregError(
                    f"no model or job has the id {args.id}; list them with `mixreg models` "
                    f"or `mixreg jobs`",
                    status=404,
                    title="Not Found",
                ) from None
            return _show_job(args, client, job)
        aliases = _aliases_of(client, model)
    if args.json:
        print(json.dumps(model.raw, indent=2))
    else:
        print_model(stdout_console(), model, aliases=aliases)
    return EXIT_OK


def _job_or_none(client: Client, job_id: str) -> Job | None:
    try:
        return client.get_job(job_id)
    except MixregError as exc:
        if exc.status == 404:
            return None
        raise


def _show_job(args: argparse.Namespace, client: Client, job: Job) -> int:
    if args.json:
        print(json.dumps(job.raw, indent=2))
        return EXIT_OK
    console = stdout_console()
    console.print(f"job {job.id}")
    console.print(f"  status            {job.status} ({job.progress.fraction:.0%})")
    console.print(f"  algorithm         {job.algorithm}, k={job.k_values or job.n_components}")
    if job.error:
        console.print(f"  error             {job.error}")
    if job.sweep is not None:
        print_sweep(console, job)
    if job.model_id is not None:
        try:
            print_model(console, client.get_model(job.model_id))
        except MixregError as exc:
            if exc.status != 404:
                raise
            console.print(f"  model             {job.model_id} (deleted)")
    return EXIT_OK
