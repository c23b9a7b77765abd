"""Tools run by hand: offline sampling, mask statistics, checkpoint inspection, the demo."""
