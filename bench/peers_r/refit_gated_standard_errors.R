# flexmix::refit's standard errors of a gated mixture of regressions (a multinomial-logit
# concomitant model, FLXPmultinom), started from given posteriors (so that flexmix's EM reaches
# the same maximum-likelihood fit as mixreg's).
# Usage: Rscript refit_gated_standard_errors.R data.csv N_FEATURES out.csv
# data.csv: columns y, x1..xd, z1..zq (the gate's columns), then p1..pk (posteriors);
# out.csv: name, estimate, std_error (per component its coefficients, intercept first, and
# log(sigma); then the gate's rows of components 2..k), and a row "logLik".
suppressPackageStartupMessages(library(flexmix))
args <- commandArgs(trailingOnly = TRUE)
data <- read.csv(args[1])
n_features <- as.integer(args[2])
posterior_columns <- grep("^p[0-9]+$", names(data))
posteriors <- as.matrix(data[, posterior_columns])
feature_names <- paste0("x", seq_len(n_features))
concomitant_names <- grep("^z[0-9]+$", names(data), value = TRUE)
lines_formula <- as.formula(paste("y ~", paste(feature_names, collapse = " + ")))
gate_formula <- as.formula(paste("~", paste(concomitant_names, collapse = " + ")))
model <- flexmix(lines_formula, data = data, k = ncol(posteriors), cluster = posteriors,
                 concomitant = FLXPmultinom(gate_formula),
                 control = list(tolerance = 1e-12, iter.max = 10000, minprior = 0))
fitted <- refit(model)
estimates <- fitted@coef
std_errors <- sqrt(diag(fitted@vcov))
out <- data.frame(name = c(names(estimates), "logLik"),
                  estimate = c(unname(estimates), as.numeric(logLik(model))),
                  std_error = c(unname(std_errors), NA))
write.csv(out, args[3], row.names = FALSE)
