"""Child processes that rlserve starts, talks to, watches and restarts.

:mod:`~rlserve.processes.supervisor` supervises a group of forked workers (env sub-processes,
env-runner processes); :mod:`~rlserve.processes.restarts` holds the restart policy and the
death reasons that every supervisor shares (the learner process's too);
:mod:`~rlserve.processes.wire` is how messages cross a pipe; :mod:`~rlserve.processes.child`
is what a forked child does first. numpy-free, torch-free.
"""
