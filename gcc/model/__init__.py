"""Model: GcDiT on DiffSynth's WanModel, the flow-matching objective, optimizer groups, sharding helpers and
gc25d exports (docs/design.md §7)."""
