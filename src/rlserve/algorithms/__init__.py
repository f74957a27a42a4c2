"""Learning algorithms. Each one consumes :class:`rlserve.samples.Fragment` batches only."""
