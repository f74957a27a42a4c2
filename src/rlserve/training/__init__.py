"""The learner process.

It reads the experience log, hands each fragment to its policy's learner, publishes weights
and writes checkpoints; the server starts and supervises it.
"""
