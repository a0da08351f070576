# flexmix's maximum likelihood on one set of rows, for the likelihood benchmark.
#
# Usage: Rscript likelihood.R TRAIN_CSV MODE K N_STARTS SEED OUTPUT_JSON
#
# TRAIN_CSV: the rows, the target in the first column (y) and the features after it (x1..xd).
# MODE "fit": set.seed(SEED); stepFlexmix(y ~ ., k = K, nrep = N_STARTS), which keeps the best
#   start by log-likelihood; the output holds its log-likelihood, BIC, the number of components
#   it kept (flexmix drops a component whose share falls below its minprior), its wall seconds,
#   per kept component its prior, noise sd, intercept and slopes, and, when it kept K components, refit()'s
#   standard errors of those (refit's seconds apart: they are not part of the fit's time).
# MODE "sweep": set.seed(SEED); stepFlexmix(y ~ ., k = 1:K, nrep = N_STARTS); per k its
#   log-likelihood, BIC and the number of components kept, and the sweep's wall seconds.

suppressPackageStartupMessages({
  library(flexmix)
  library(jsonlite)
})

arguments <- commandArgs(trailingOnly = TRUE)
if (length(arguments) != 6) {
  stop("usage: Rscript likelihood.R TRAIN_CSV MODE K N_STARTS SEED OUTPUT_JSON")
}
train <- read.csv(arguments[[1]])
mode <- arguments[[2]]
n_components <- as.integer(arguments[[3]])
n_starts <- as.integer(arguments[[4]])
seed <- as.integer(arguments[[5]])
output_path <- arguments[[6]]

n_features <- ncol(train) - 1
feature_names <- paste0("x", seq_len(n_features))
names(train) <- c("y", feature_names)
elapsed <- function() proc.time()[["elapsed"]]

describe_fit <- function(fit) {
  # Rows coef.(Intercept), coef.x1, ..., sigma; one column per kept component.
  lines <- as.matrix(parameters(fit))
  list(
    log_likelihood = as.numeric(logLik(fit)), bic = BIC(fit), n_kept = ncol(lines),
    prior = unname(fit@prior), sigma = unname(lines[nrow(lines), ]),
    intercept = unname(lines[1, ]),
    coef = unname(lapply(seq_len(ncol(lines)), function(j) lines[1 + seq_len(n_features), j]))
  )
}

if (mode == "fit") {
  set.seed(seed)
  started <- elapsed()
  fit <- stepFlexmix(y ~ ., data = train, k = n_components, nrep = n_starts, verbose = FALSE)
  seconds <- elapsed() - started
  result <- c(describe_fit(fit), list(seconds = seconds))
  if (result$n_kept == n_components) {
    started <- elapsed()
    refitted <- tryCatch(refit(fit), error = function(error) error)
    result$refit_seconds <- elapsed() - started
    if (inherits(refitted, "error")) {
      result$refit_error <- conditionMessage(refitted)
    } else {
      # The point refit() took its standard errors at (it optimizes on from the EM fit):
      # per component coef.(Intercept), coef.x1, ..., log(sigma); the logits of components
      # 2..K against the first (concomitant_Comp.j.alpha).
      result$refit_coef <- as.list(refitted@coef)
      std_errors <- sqrt(diag(refitted@vcov))
      names(std_errors) <- names(refitted@coef)
      # Per component: the intercept's standard error, then the slopes'.
      result$intercept_se <- sapply(seq_len(n_components), function(j) {
        unname(std_errors[[sprintf("model.1_Comp.%d_coef.(Intercept)", j)]])
      })
      result$coef_se <- lapply(seq_len(n_components), function(j) {
        unname(std_errors[sprintf("model.1_Comp.%d_coef.%s", j, feature_names)])
      })
    }
  }
} else if (mode == "sweep") {
  set.seed(seed)
  started <- elapsed()
  fits <- stepFlexmix(y ~ ., data = train, k = seq_len(n_components), nrep = n_starts,
                      verbose = FALSE)
  seconds <- elapsed() - started
  per_k <- lapply(seq_len(n_components), function(k) {
    c(list(k = k), describe_fit(fits@models[[as.character(k)]]))
  })
  result <- list(seconds = seconds, fits = per_k)
} else {
  stop(sprintf("unknown mode %s (fit or sweep)", mode))
}
writeLines(toJSON(result, auto_unbox = TRUE, digits = NA), output_path)
