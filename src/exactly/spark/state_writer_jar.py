"""exactly's state writer class for Spark's JVM, put on the class path of every session exactly
starts (:mod:`exactly.spark.session`).

The source is ``jvm/StateWriter.java`` beside this module; :mod:`exactly.savepoints.state_writer`
uses the class to write state rows through Spark's own providers (restores that rescale or
switch the state backend). A wheel carries the jar, compiled when the wheel was built against
the PySpark of the build (``jvm/exactly-state-writer.jar`` with ``.json`` metadata: that
PySpark's version and the source's sha256). A checkout (editable install), or a PySpark other
than the build's, compiles the source once into the user cache instead
(:mod:`exactly.spark.jvm_compile`: ``javac``, or the ``java`` runtime's compiler module).
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from pathlib import Path

from exactly.cache import user_cache
from exactly.errors import ConfigError
from exactly.logs import log_event
from exactly.spark.jvm_compile import CompileError, compile_jar, find_compiler, source_sha256

SOURCE = Path(__file__).parent / "jvm" / "StateWriter.java"
CLASS = "dev.exactly.state.StateWriter"
#: the jar a wheel carries (compiled by setup.py's build step) and what it was built from
PACKAGED_JAR = SOURCE.parent / "exactly-state-writer.jar"
PACKAGED_METADATA = SOURCE.parent / "exactly-state-writer.json"

logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    return user_cache("jvm")


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def jar_path() -> Path:
    """Where the writer compiled on this machine for this source and this PySpark lives."""
    import pyspark

    digest = hashlib.sha256(SOURCE.read_bytes() + pyspark.__version__.encode()).hexdigest()
    return cache_dir() / f"exactly-state-{digest[:16]}.jar"


def packaged_jar() -> Path | None:
    """The jar the wheel carries, when it was built from this source against the installed
    PySpark's version; None otherwise (a checkout has none; a mismatch is logged)."""
    if not (PACKAGED_JAR.is_file() and PACKAGED_METADATA.is_file()):
        return None
    import pyspark

    try:
        built = json.loads(PACKAGED_METADATA.read_text())
    except ValueError:
        built = {}
    want = {"pyspark": pyspark.__version__, "source_sha256": source_sha256(SOURCE)}
    if {k: built.get(k) for k in want} != want:
        log_event(logger, "state_writer_jar_mismatch", logging.WARNING, jar=str(PACKAGED_JAR),
                  built=built, installed=want)
        return None
    return PACKAGED_JAR


def ensure_jar() -> Path | None:
    """The writer's jar: the wheel's when it fits the installed PySpark, else one compiled
    now into the user cache (once per source and PySpark); None when no Java compiler is
    available (only restores that rewrite state need it; they then fail naming the fix).
    Raises ConfigError when the source does not compile."""
    packaged = packaged_jar()
    if packaged is not None:
        return packaged
    target = jar_path()
    if target.is_file():
        return target
    compiler = find_compiler()
    if compiler is None:
        return None
    try:
        compile_jar(compiler, SOURCE, _pyspark_jars(), target)
    except CompileError as exc:
        raise ConfigError(str(exc)) from exc
    log_event(logger, "state_writer_compiled", jar=str(target), compiler=compiler[0])
    return target


def main() -> int:
    """``python -m exactly.spark.state_writer_jar``: print the jar's path (for ``--jars`` of
    ``spark-submit`` or ``spark.jars`` of a session exactly does not start); exit 1 naming
    the fix when there is none."""
    jar = ensure_jar()
    if jar is None:
        print("exactly's state writer jar is not built for this PySpark and no Java compiler "
              "is here to build it: install a JDK (javac), or the PySpark version exactly's "
              "wheel was built for", file=sys.stderr)
        return 1
    print(jar)
    return 0


if __name__ == "__main__":
    sys.exit(main())
