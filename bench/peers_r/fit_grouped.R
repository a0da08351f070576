# Fit a grouped mixture of k linear regressions with flexmix (all rows of a group on one line:
# flexmix's `y ~ x | g`), for several seeds.
#
# Usage: Rscript fit_grouped.R TRAIN_CSV N_FEATURES K SEEDS N_STARTS OUTPUT_JSON
#
# TRAIN_CSV: the training rows: the target in the first column, the group (an integer code) in
# the second, then N_FEATURES features. Each seed is one call of
#   stepFlexmix(y ~ x1 + ... | g, k = K, nrep = N_STARTS, model = FLXMRglm())
# which keeps the start of highest log-likelihood. OUTPUT_JSON: one object per seed with its
# wall and CPU seconds, status (ok or error), message, log-likelihood, the number of lines it
# ended with (flexmix drops a component whose share falls below its minprior), and per line its
# prior, intercept, slopes and noise standard deviation.

suppressPackageStartupMessages({
  library(flexmix)
  library(jsonlite)
})

arguments <- commandArgs(trailingOnly = TRUE)
if (length(arguments) != 6) {
  stop("usage: Rscript fit_grouped.R TRAIN_CSV N_FEATURES K SEEDS N_STARTS OUTPUT_JSON")
}
train <- read.csv(arguments[[1]])
n_features <- as.integer(arguments[[2]])
n_components <- as.integer(arguments[[3]])
seeds <- as.integer(strsplit(arguments[[4]], ",", fixed = TRUE)[[1]])
n_starts <- as.integer(arguments[[5]])
output_path <- arguments[[6]]

feature_names <- paste0("x", seq_len(n_features))
names(train) <- c("y", "g", feature_names)
train$g <- factor(train$g)
lines_formula <- as.formula(paste("y ~", paste(feature_names, collapse = " + "), "| g"))

elapsed <- function() proc.time()[["elapsed"]]
cpu <- function() sum(proc.time()[c("user.self", "sys.self")])

fit_one <- function(seed) {
  set.seed(seed)
  started <- elapsed()
  cpu_started <- cpu()
  fit <- tryCatch(
    stepFlexmix(
      lines_formula, data = train, k = n_components, nrep = n_starts, verbose = FALSE,
      model = FLXMRglm()
    ),
    error = function(error) error
  )
  seconds <- elapsed() - started
  cpu_seconds <- cpu() - cpu_started
  if (inherits(fit, "error")) {
    return(list(seed = seed, seconds = seconds, cpu_seconds = cpu_seconds, status = "error",
                message = conditionMessage(fit)))
  }
  # Rows coef.(Intercept), coef.x1, ..., sigma; one column per line.
  lines <- parameters(fit)
  list(
    seed = seed, seconds = seconds, cpu_seconds = cpu_seconds, status = "ok", message = "",
    log_likelihood = as.numeric(logLik(fit)), n_components = ncol(lines),
    prior = unname(fit@prior),
    intercept = unname(lines[1, ]),
    coef = unname(lapply(seq_len(ncol(lines)), function(j) lines[1 + seq_len(n_features), j])),
    sigma = unname(lines[nrow(lines), ])
  )
}

results <- lapply(seeds, fit_one)
writeLines(toJSON(results, auto_unbox = TRUE, digits = NA), output_path)
