"""The in-process Algorithm: a learner with hosted env runners and network clients as sources."""
