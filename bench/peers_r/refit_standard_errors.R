# flexmix::refit's standard errors of a Gaussian mixture of regressions, started from given
# posteriors (so that flexmix's EM reaches the same maximum-likelihood fit as mixreg's).
# Usage: Rscript refit_standard_errors.R data.csv out.csv
# data.csv: columns y, x1..xd, then p1..pk (posteriors); out.csv: name, estimate, std_error
# (per component its coefficients, intercept first, and sigma; then the prior's logits), and
# a row "logLik".
suppressPackageStartupMessages(library(flexmix))
args <- commandArgs(trailingOnly = TRUE)
data <- read.csv(args[1])
posterior_columns <- grep("^p[0-9]+$", names(data))
posteriors <- as.matrix(data[, posterior_columns])
frame <- data[, -posterior_columns, drop = FALSE]
model <- flexmix(y ~ ., data = frame, k = ncol(posteriors), cluster = posteriors,
                 control = list(tolerance = 1e-12, iter.max = 10000, minprior = 0))
fitted <- refit(model)
estimates <- fitted@coef
std_errors <- sqrt(diag(fitted@vcov))
out <- data.frame(name = c(names(estimates), "logLik"),
                  estimate = c(unname(estimates), as.numeric(logLik(model))),
                  std_error = c(unname(std_errors), NA))
write.csv(out, args[2], row.names = FALSE)
