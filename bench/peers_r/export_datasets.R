# Export R's bundled data sets to CSV for the peers benchmark.
#
# Usage: Rscript export_datasets.R MANIFEST_CSV OUTPUT_FOLDER
#
# MANIFEST_CSV has the columns name, package, dataset, columns (space-separated column names,
# the target first). Each data set is written to OUTPUT_FOLDER/<name>.csv with exactly those
# columns, rows with a missing value dropped.

arguments <- commandArgs(trailingOnly = TRUE)
if (length(arguments) != 2) {
  stop("usage: Rscript export_datasets.R MANIFEST_CSV OUTPUT_FOLDER")
}
manifest <- read.csv(arguments[[1]], stringsAsFactors = FALSE)
output_folder <- arguments[[2]]
dir.create(output_folder, showWarnings = FALSE, recursive = TRUE)

for (row in seq_len(nrow(manifest))) {
  entry <- manifest[row, ]
  holder <- new.env()
  suppressPackageStartupMessages(
    data(list = entry$dataset, package = entry$package, envir = holder)
  )
  frame <- as.data.frame(get(entry$dataset, envir = holder))
  columns <- strsplit(entry$columns, " ", fixed = TRUE)[[1]]
  missing_columns <- setdiff(columns, names(frame))
  if (length(missing_columns) > 0) {
    stop(sprintf("%s::%s has no column(s) %s", entry$package, entry$dataset,
                 paste(missing_columns, collapse = ", ")))
  }
  frame <- frame[, columns, drop = FALSE]
  frame <- frame[complete.cases(frame), , drop = FALSE]
  write.csv(frame, file.path(output_folder, paste0(entry$name, ".csv")), row.names = FALSE)
}
