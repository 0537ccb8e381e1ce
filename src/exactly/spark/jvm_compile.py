"""Compiling exactly's Java source into a jar against PySpark's jars: used by the wheel build
(``setup.py`` loads this file by path, so it imports nothing but the standard library) and by
:mod:`exactly.spark.state_writer_jar` when the packaged jar does not fit the installed PySpark.

The compiler is ``javac`` (``$JAVA_HOME/bin/javac``, else the one on ``PATH``), else the
``jdk.compiler`` module of the ``java`` runtime (``java -m jdk.compiler/com.sun.tools.javac.Main``;
Debian's ``openjdk-17-jre-headless`` ships it, minimal runtimes made by ``jlink`` may not).
Class files target Java 17 (``--release 17``), the oldest Java PySpark 4 runs on, whatever
JDK compiles them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

#: the Java release the class files target (PySpark 4 needs Java 17 or newer)
JAVA_RELEASE = "17"
_MODULE_JAVAC = ["-m", "jdk.compiler/com.sun.tools.javac.Main"]


class CompileError(RuntimeError):
    """No compiler was found, or the source did not compile (the message says which)."""


def source_sha256(source: Path) -> str:
    return hashlib.sha256(source.read_bytes()).hexdigest()


def _java_home_tool(name: str) -> str | None:
    home = os.environ.get("JAVA_HOME")
    tool = Path(home, "bin", name) if home else None
    return str(tool) if tool is not None and os.access(tool, os.X_OK) else None


def find_compiler() -> list[str] | None:
    """The command that runs a Java compiler here, or None: ``javac``, else ``java -m
    jdk.compiler/...`` when the runtime has that module (one short JVM start to ask)."""
    javac = _java_home_tool("javac") or shutil.which("javac")
    if javac is not None:
        return [javac]
    java = _java_home_tool("java") or shutil.which("java")
    if java is None:
        return None
    try:
        modules = subprocess.run([java, "--list-modules"], capture_output=True, text=True,
                                 timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if modules.returncode == 0 and any(line.split("@")[0] == "jdk.compiler"
                                       for line in modules.stdout.splitlines()):
        return [java, *_MODULE_JAVAC]
    return None


def compile_jar(compiler: list[str], source: Path, classpath_dir: Path, target: Path) -> None:
    """Compile ``source`` against every jar in ``classpath_dir`` into the jar ``target``
    (written whole or not at all: built beside it, then renamed). Raises CompileError with
    the compiler's output when the source does not compile."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="exactly-javac-") as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        # the jars listed one by one: a class path wildcard (dir/*) is expanded by the javac
        # launcher only, not by `java -m jdk.compiler/...`
        classpath = os.pathsep.join(str(jar) for jar in sorted(classpath_dir.glob("*.jar")))
        result = subprocess.run(
            [*compiler, "-nowarn", "--release", JAVA_RELEASE, "-cp", classpath,
             "-d", str(classes), str(source)], capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise CompileError(f"compiling {source.name} against {classpath_dir} failed:\n"
                               f"{result.stdout}{result.stderr}")
        staged = target.with_name(f".{target.name}.{os.getpid()}.part")
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as jar:
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, path.relative_to(classes).as_posix())
        os.replace(staged, target)
