"""The checkpoint directory as one concept: its layout, Spark's files, the job's control
channel and status, the restart log and the checkpoint history, over a store that is a POSIX
directory or an S3 prefix (:mod:`exactly.checkpoint.store`). No pyspark here."""
