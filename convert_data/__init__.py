"""`python -m convert_data`: a thin entry over `gcc.convert` (prepared clips -> MDS shards)."""
