"""`python -m convert_data`: a thin entry over `gcc.data.convert` (prepared clips -> MDS shards)."""
