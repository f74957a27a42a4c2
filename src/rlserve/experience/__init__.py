"""The experience-collection core every mode uses.

Episodes and their agents' columns, agent groups, the collector and the vector rollout: they
turn client calls and env steps into :class:`~rlserve.protocol.fragment.Fragment` s.
"""
