"""Data: storage, the prepared layout and its converter to MDS shards, the text table, the loader (StreamingDataset,
per-sample draws, dropouts, the UNKNOWN mask) and the synthetic world (docs/design.md §4-§6)."""
