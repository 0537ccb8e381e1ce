"""Savepoints: portable, self-contained snapshots of a job, as in Flink.

* :mod:`~exactly.savepoints.manifest` - the directory layout and its ``_metadata`` manifest;
* :mod:`~exactly.savepoints.operators` - operator uids and the job's stateful operators;
* :mod:`~exactly.savepoints.take` - taking one from a checkpoint's last completed epoch;
* :mod:`~exactly.savepoints.restore` - restoring one into a new checkpoint (remap, rescale,
  switch the state backend);
* :mod:`~exactly.savepoints.state_writer` - writing state rows through Spark's providers.
"""

from exactly.savepoints.operators import uid

__all__ = ["uid"]
