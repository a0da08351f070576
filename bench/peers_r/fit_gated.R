# Fit a gated mixture of k linear regressions with flexmix: a multinomial-logit concomitant
# model of the mixing probabilities (FLXPmultinom), for several seeds.
#
# Usage: Rscript fit_gated.R TRAIN_CSV N_FEATURES K SEEDS N_STARTS OUTPUT_JSON
#
# TRAIN_CSV: the training rows: the target in the first column, then N_FEATURES features, then
# the concomitant columns. Each seed is one call of
#   stepFlexmix(y ~ x1 + ..., k = K, nrep = N_STARTS, concomitant = FLXPmultinom(~ z1 + ...))
# which keeps the start of highest log-likelihood. OUTPUT_JSON: one object per seed with its
# wall and CPU seconds, status (ok or error), message, log-likelihood, the number of lines it ended with
# (flexmix drops a component whose share falls below its minprior), and per line its intercept,
# slopes and noise standard deviation, and the gate's intercept and slopes (the first line, the
# reference, has zeros).
#
# Usage: Rscript fit_gated.R --export-nregfix CSV writes flexmix's NregFix example data (x1, the
# 0/1 factor x2 and the 0/1 concomitant w as numbers, then y) and exits.

suppressPackageStartupMessages({
  library(flexmix)
  library(jsonlite)
})

arguments <- commandArgs(trailingOnly = TRUE)
if (length(arguments) == 2 && arguments[[1]] == "--export-nregfix") {
  data("NregFix", package = "flexmix")
  exported <- data.frame(
    y = as.numeric(NregFix$y), x1 = NregFix$x1,
    x2 = as.numeric(as.character(NregFix$x2)), w = as.numeric(as.character(NregFix$w))
  )
  write.csv(exported, arguments[[2]], row.names = FALSE)
  quit(status = 0)
}
if (length(arguments) != 6) {
  stop("usage: Rscript fit_gated.R TRAIN_CSV N_FEATURES K SEEDS N_STARTS OUTPUT_JSON")
}
train <- read.csv(arguments[[1]])
n_features <- as.integer(arguments[[2]])
n_components <- as.integer(arguments[[3]])
seeds <- as.integer(strsplit(arguments[[4]], ",", fixed = TRUE)[[1]])
n_starts <- as.integer(arguments[[5]])
output_path <- arguments[[6]]

n_concomitant <- ncol(train) - 1 - n_features
feature_names <- paste0("x", seq_len(n_features))
concomitant_names <- paste0("z", seq_len(n_concomitant))
names(train) <- c("y", feature_names, concomitant_names)
lines_formula <- as.formula(paste("y ~", paste(feature_names, collapse = " + ")))
gate_formula <- as.formula(paste("~", paste(concomitant_names, collapse = " + ")))

elapsed <- function() proc.time()[["elapsed"]]
cpu <- function() sum(proc.time()[c("user.self", "sys.self")])

fit_one <- function(seed) {
  set.seed(seed)
  started <- elapsed()
  cpu_started <- cpu()
  fit <- tryCatch(
    stepFlexmix(
      lines_formula, data = train, k = n_components, nrep = n_starts, verbose = FALSE,
      concomitant = FLXPmultinom(gate_formula)
    ),
    error = function(error) error
  )
  seconds <- elapsed() - started
  cpu_seconds <- cpu() - cpu_started
  if (inherits(fit, "error")) {
    return(list(seed = seed, seconds = seconds, cpu_seconds = cpu_seconds, status = "error",
                message = conditionMessage(fit)))
  }
  # Rows (Intercept), x1, ..., sigma; one column per line.
  lines <- parameters(fit)
  # Rows (Intercept), z1, ...; one column per line, the first all zeros.
  gate <- fit@concomitant@coef
  list(
    seed = seed, seconds = seconds, cpu_seconds = cpu_seconds, status = "ok", message = "",
    log_likelihood = as.numeric(logLik(fit)), n_components = ncol(lines),
    intercept = unname(lines[1, ]),
    coef = unname(lapply(seq_len(ncol(lines)), function(j) lines[1 + seq_len(n_features), j])),
    sigma = unname(lines[nrow(lines), ]),
    gate_intercept = unname(gate[1, ]),
    gate_coef = unname(lapply(seq_len(ncol(gate)), function(j) gate[-1, j]))
  )
}

results <- lapply(seeds, fit_one)
writeLines(toJSON(results, auto_unbox = TRUE, digits = NA), output_path)
