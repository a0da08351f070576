# Fit a mixture of k linear regressions with flexmix and with mixtools, for several seeds.
#
# Usage: Rscript fit_peers.R TRAIN_CSV K SEEDS N_STARTS MIXTOOLS_BUDGET_SECONDS OUTPUT_CSV [PACKAGES]
#
# TRAIN_CSV: the training rows, the target in the first column and the features after it.
# SEEDS: comma-separated integers; each seed is one fit of each package, made of N_STARTS
# random starts of which the one with the highest log-likelihood is kept:
#   - flexmix: stepFlexmix(y ~ ., k = K, nrep = N_STARTS) (it keeps the best itself);
#   - mixtools: N_STARTS calls of regmixEM(y, X, k = K); a start that raises an error is counted
#     and skipped. The starts of one seed share MIXTOOLS_BUDGET_SECONDS of wall time: a start
#     running when the budget runs out is stopped (counted as timed out) and no further start
#     is made.
# PACKAGES: comma-separated, of flexmix and mixtools (both when left out).
# OUTPUT_CSV: one row per fitted component (or one row with NA coefficients for a fit that
# produced nothing) with the columns package, seed, status, seconds, loglik, n_components,
# starts_done, starts_failed, starts_timed_out, starts_not_converged, internal_restarts,
# message, component, intercept, slope_1, ..., slope_d.

suppressPackageStartupMessages({
  library(flexmix)
  library(mixtools)
})

arguments <- commandArgs(trailingOnly = TRUE)
if (!(length(arguments) %in% c(6, 7))) {
  stop(paste("usage: Rscript fit_peers.R TRAIN_CSV K SEEDS N_STARTS MIXTOOLS_BUDGET_SECONDS",
             "OUTPUT_CSV [PACKAGES]"))
}
train <- read.csv(arguments[[1]])
n_components <- as.integer(arguments[[2]])
seeds <- as.integer(strsplit(arguments[[3]], ",", fixed = TRUE)[[1]])
n_starts <- as.integer(arguments[[4]])
mixtools_budget <- as.numeric(arguments[[5]])
output_path <- arguments[[6]]
packages <- if (length(arguments) == 7) {
  strsplit(arguments[[7]], ",", fixed = TRUE)[[1]]
} else {
  c("flexmix", "mixtools")
}
unknown_packages <- setdiff(packages, c("flexmix", "mixtools"))
if (length(unknown_packages) > 0) {
  stop(sprintf("unknown package(s) %s", paste(unknown_packages, collapse = ", ")))
}

names(train) <- c("y", paste0("x", seq_len(ncol(train) - 1)))
y <- train$y
X <- as.matrix(train[, -1, drop = FALSE])
n_features <- ncol(X)

elapsed <- function() proc.time()[["elapsed"]]

one_line <- function(message) {
  gsub("[\r\n,]+", " ", message)
}

# Rows of the output for one fit: `lines` is a (1 + n_features) x n_lines matrix whose columns
# are (intercept, slopes) of each fitted line, or NULL when the fit produced nothing.
fit_rows <- function(package, seed, status, seconds, loglik, lines, counts, message) {
  n_lines <- if (is.null(lines)) 0L else ncol(lines)
  base <- data.frame(
    package = package, seed = seed, status = status, seconds = seconds, loglik = loglik,
    n_components = n_lines, starts_done = counts[["done"]], starts_failed = counts[["failed"]],
    starts_timed_out = counts[["timed_out"]], starts_not_converged = counts[["not_converged"]],
    internal_restarts = counts[["internal_restarts"]], message = one_line(message),
    stringsAsFactors = FALSE
  )
  if (n_lines == 0) {
    coefficients <- matrix(NA_real_, nrow = 1, ncol = 1 + n_features)
    component <- NA_integer_
  } else {
    coefficients <- t(lines)
    component <- seq_len(n_lines)
    base <- base[rep(1, n_lines), ]
  }
  colnames(coefficients) <- c("intercept", paste0("slope_", seq_len(n_features)))
  cbind(base, component = component, coefficients)
}

fit_flexmix <- function(seed) {
  set.seed(seed)
  counts <- c(done = 0, failed = 0, timed_out = 0, not_converged = 0, internal_restarts = 0)
  started <- elapsed()
  fitted <- tryCatch(
    stepFlexmix(y ~ ., data = train, k = n_components, nrep = n_starts, verbose = FALSE),
    error = function(error) error
  )
  seconds <- elapsed() - started
  if (inherits(fitted, "error")) {
    counts[["failed"]] <- n_starts
    return(fit_rows("flexmix", seed, "failed", seconds, NA_real_, NULL, counts,
                    conditionMessage(fitted)))
  }
  counts[["done"]] <- n_starts
  counts[["not_converged"]] <- as.integer(!fitted@converged)
  lines <- as.matrix(parameters(fitted))[seq_len(1 + n_features), , drop = FALSE]
  fit_rows("flexmix", seed, "ok", seconds, as.numeric(logLik(fitted)), lines, counts, "")
}

fit_mixtools <- function(seed) {
  set.seed(seed)
  counts <- c(done = 0, failed = 0, timed_out = 0, not_converged = 0, internal_restarts = 0)
  best <- NULL
  messages <- character(0)
  started <- elapsed()
  for (start in seq_len(n_starts)) {
    remaining <- mixtools_budget - (elapsed() - started)
    if (remaining <= 0) {
      break
    }
    printed <- character(0)
    setTimeLimit(elapsed = remaining, transient = TRUE)
    fitted <- tryCatch(
      {
        printed <- capture.output(result <- regmixEM(y, X, k = n_components))
        result
      },
      error = function(error) error
    )
    setTimeLimit(elapsed = Inf)
    if (inherits(fitted, "error")) {
      message <- conditionMessage(fitted)
      if (grepl("time limit", message, fixed = TRUE)) {
        counts[["timed_out"]] <- counts[["timed_out"]] + 1
      } else {
        counts[["failed"]] <- counts[["failed"]] + 1
        messages <- c(messages, message)
      }
      next
    }
    counts[["done"]] <- counts[["done"]] + 1
    counts[["internal_restarts"]] <- counts[["internal_restarts"]] + fitted$restarts
    if (any(grepl("NOT CONVERGENT", printed, fixed = TRUE))) {
      counts[["not_converged"]] <- counts[["not_converged"]] + 1
    }
    if (all(is.finite(fitted$beta)) && is.finite(fitted$loglik) &&
        (is.null(best) || fitted$loglik > best$loglik)) {
      best <- fitted
    }
  }
  seconds <- elapsed() - started
  message <- paste(unique(messages), collapse = "; ")
  if (is.null(best)) {
    return(fit_rows("mixtools", seed, "failed", seconds, NA_real_, NULL, counts, message))
  }
  lines <- matrix(best$beta, nrow = 1 + n_features)
  fit_rows("mixtools", seed, "ok", seconds, best$loglik, lines, counts, message)
}

rows <- list()
fitters <- list(flexmix = fit_flexmix, mixtools = fit_mixtools)
for (seed in seeds) {
  for (package in packages) {
    rows[[length(rows) + 1]] <- fitters[[package]](seed)
  }
}
write.csv(do.call(rbind, rows), output_path, row.names = FALSE)
