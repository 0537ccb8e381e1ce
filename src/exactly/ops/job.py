"""The job contract of ``exactly run``: a Python file with a ``build(spark)`` function.

A job file defines::

    from exactly import CheckpointConfig, Job

    SPARK_CONF = {"spark.sql.shuffle.partitions": "4"}   # optional, applied at session start

    def build(spark):
        events = spark.readStream.format("exactly.datagen").option("rowsPerSecond", 500).load()
        return Job(events, sink_format="exactly.files", path="/data/out",
                   checkpoint=CheckpointConfig(interval="2s", timeout="1min"))

``build`` is called once per driver process with the session exactly created; the returned
:class:`Job` is started, and restarted after failures, by :mod:`exactly.ops.supervisor`. The
checkpoint directory is the job's address: ``exactly run --checkpoint DIR`` overrides the
config's ``storage``, and every later command (``stop``, ``cancel``) names it.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from exactly import options as opt
from exactly.config import CheckpointConfig
from exactly.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from exactly.ops.restart import RestartStrategy
    from exactly.protocol.faults import FaultSpec


@dataclass
class Job:
    """A streaming DataFrame, the exactly sink it goes to, and how it checkpoints.

    ``sink_format``, ``path``, ``options``, ``output_mode``, ``query_name`` are those of
    :func:`exactly.ops.query.start_query`. ``restart_strategy`` is the job's own default
    (``exactly run --restart-strategy`` overrides it; without either, exponential-delay).
    """

    df: DataFrame
    sink_format: str
    path: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    output_mode: str = "append"
    query_name: str | None = None
    restart_strategy: RestartStrategy | None = None
    accept_at_most_once: bool = False

    def with_checkpoint_dir(self, directory: str | None) -> Job:
        """This job with its checkpoint stored in ``directory`` (when given)."""
        if directory is None:
            return self
        return replace(self, checkpoint=self.checkpoint.replace(storage=directory))

    def with_fault(self, fault: FaultSpec | None) -> Job:
        """This job with ``fault`` armed in its exactly sink's options (``exactly run
        --fault``; it replaces a fault the job's own options arm). A sink that is not
        exactly's has no protocol points: its options stay as they are."""
        from exactly.spark.formats import SINK_BUILDERS

        if fault is None or self.sink_format.lower() not in SINK_BUILDERS:
            return self
        armed = {name.lower() for name in (opt.FAULT, opt.FAULT_MARKER, opt.FAULT_ACTION)}
        own = {key: value for key, value in self.options.items()
               if key.lower() not in armed}  # option names compare case-insensitively
        return replace(self, options={**own, **fault.options()})


@dataclass(frozen=True)
class JobFile:
    """A loaded job file: its ``build`` function and optional ``SPARK_CONF``."""

    path: Path
    build: Callable[[SparkSession], Job]
    spark_conf: Mapping[str, str]

    def session_conf(self) -> dict[str, str]:
        """The Spark settings the job's session starts with: the job's name
        (``spark.exactly.jobName``, the file's stem, e.g. the default consumer group of
        exactly's Kafka reader) unless ``SPARK_CONF`` names it, then ``SPARK_CONF``."""
        return {opt.SESSION_JOB_NAME: self.path.stem, **self.spark_conf}


def load_job_file(path: str | Path) -> JobFile:
    """Import the job file at ``path`` and check it follows the contract.

    Raises ConfigError when the file is missing, fails to import (the cause is chained), or
    has no callable ``build``.
    """
    file = Path(path).absolute()
    if not file.is_file():
        raise ConfigError(f"job file {file} does not exist; give the path of a Python file "
                          "defining build(spark) -> exactly.Job")
    module = _import(file)
    build = getattr(module, "build", None)
    if not callable(build):
        raise ConfigError(f"job file {file} defines no build(spark) function; add one that "
                          "returns exactly.Job(df, sink_format=..., ...)")
    conf = getattr(module, "SPARK_CONF", {}) or {}
    if not isinstance(conf, Mapping):
        raise ConfigError(f"job file {file}: SPARK_CONF must be a dict of Spark settings")
    return JobFile(file, build, {str(k): str(v) for k, v in conf.items()})


def _import(file: Path) -> ModuleType:
    name = f"exactly_job_{abs(hash(str(file)))}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"job file {file} is not a Python module (name it *.py)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # Spark's Python workers cannot import the job file under this name: its functions and
    # classes (a UDF, a StatefulProcessor) travel to them by value, not by reference
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    sys.path.insert(0, str(file.parent))  # the job's own helper modules beside it
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ConfigError(f"job file {file} failed to import: {type(exc).__name__}: {exc}"
                          ) from exc
    return module


def check_job(job: Any, file: Path | str = "build(spark)") -> Job:
    """``job`` if ``build`` returned a :class:`Job`, else a ConfigError naming the fix."""
    if not isinstance(job, Job):
        raise ConfigError(f"{file}: build(spark) returned {type(job).__name__}, not "
                          "exactly.Job; return Job(df, sink_format=..., path=..., ...)")
    if not job.df.isStreaming:
        raise ConfigError(f"{file}: Job.df is not a streaming DataFrame; read it with "
                          "spark.readStream...")
    return job
