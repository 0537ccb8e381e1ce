"""exactly's state writer class for Spark's JVM: compiled on first use, cached, and put on
the class path of every session exactly starts (:mod:`exactly.spark.session`).

The source is ``jvm/StateWriter.java`` beside this module; :mod:`exactly.savepoints.state_writer`
uses the class to write state rows through Spark's own providers (restores that rescale or
switch the state backend).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from exactly.cache import user_cache
from exactly.errors import ConfigError

SOURCE = Path(__file__).parent / "jvm" / "StateWriter.java"
CLASS = "dev.exactly.state.StateWriter"


def cache_dir() -> Path:
    return user_cache("jvm")


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def jar_path() -> Path:
    """Where the compiled writer for this source and this PySpark lives."""
    import pyspark

    digest = hashlib.sha256(SOURCE.read_bytes() + pyspark.__version__.encode()).hexdigest()
    return cache_dir() / f"exactly-state-{digest[:16]}.jar"


def ensure_jar() -> Path | None:
    """The writer's jar, compiled now if needed; None when no ``javac`` is installed (only
    restores that rewrite state need it; they then fail naming the fix)."""
    target = jar_path()
    if target.is_file():
        return target
    javac = shutil.which("javac")
    if javac is None:
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="exactly-javac-") as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        result = subprocess.run(
            [javac, "-nowarn", "-cp", str(_pyspark_jars() / "*"), "-d", str(classes),
             str(SOURCE)], capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise ConfigError(f"compiling {SOURCE.name} against PySpark's jars failed:\n"
                              f"{result.stdout}{result.stderr}")
        staged = Path(tmp) / target.name
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as jar:
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, path.relative_to(classes).as_posix())
        shutil.move(str(staged), target)
    return target
