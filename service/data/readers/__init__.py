"""Readers of uploaded files, one module per format: :mod:`.csv`, :mod:`.parquet`,
:mod:`.npz` and :mod:`.npy` (a pair of ``.npy`` files). Each reads its file in blocks of rows,
checks them with :mod:`service.data.ingest`'s value checks and appends them to a
:class:`~service.data.staging.StagedDataset`."""
