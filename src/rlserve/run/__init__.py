"""Everything a run keeps on disk.

The run folder, checkpoints, the experience log, the serving process's state, metrics files
and atomic writes. numpy only: no torch.
"""
