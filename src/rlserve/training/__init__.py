"""Training: the one learner loop, the sampler interface, and the learner process.

:mod:`~rlserve.training.driver` (the loop every trainer runs: take experience, update when
ready, publish, checkpoint), :mod:`~rlserve.training.sampler` (the interface every source of
experience implements), :mod:`~rlserve.training.policy_learner` (one policy's learner, log
position and checkpoints) and :mod:`~rlserve.training.learner_worker` (the learner process the
server starts and supervises: it reads the experience log into a driver).
"""
