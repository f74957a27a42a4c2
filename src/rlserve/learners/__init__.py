"""The learning algorithms: PPO, DQN and SAC, their settings, models and shared maths.

Each learner consumes :class:`~rlserve.protocol.fragment.Fragment` batches only: nothing here
knows about the network or where the fragments came from.
"""
