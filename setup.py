"""exactly's build step (everything else is in pyproject.toml): a wheel carries the state
writer's jar, compiled here against the PySpark of the build environment
(``exactly/spark/jvm/exactly-state-writer.jar``, with ``.json`` metadata: that PySpark's
version and the source's sha256, which the runtime checks before using it). Building a wheel
needs a JDK (``javac``, or a Java runtime with the ``jdk.compiler`` module) and PySpark; an
editable install (``pip install -e .``) skips the step: the checkout compiles the jar into
the user cache on first use."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent
JVM = Path("exactly", "spark", "jvm")
SOURCE = HERE / "src" / JVM / "StateWriter.java"


def _jvm_compile():
    """exactly/spark/jvm_compile.py, loaded by path (the package's dependencies are not
    installed in a build environment)."""
    spec = importlib.util.spec_from_file_location(
        "exactly_jvm_compile", HERE / "src" / "exactly" / "spark" / "jvm_compile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithStateWriter(build_py):
    """``build_py`` plus the state writer's jar and its metadata in the build tree."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            self.build_state_writer(Path(self.build_lib) / JVM)

    def build_state_writer(self, target: Path) -> None:
        jvm_compile = _jvm_compile()
        try:
            import pyspark
        except ImportError:
            raise SystemExit(
                "building exactly's wheel needs PySpark in the build environment (the state "
                "writer's jar compiles against its jars): build with `python -m build` (its "
                "isolated environment gets PySpark), or `pip install pyspark==<the pinned "
                "version>` before `python -m build --no-isolation`") from None
        compiler = jvm_compile.find_compiler()
        if compiler is None:
            raise SystemExit(
                "building exactly's wheel needs a Java compiler for the state writer "
                "(StateWriter.java): install a JDK (Debian: openjdk-17-jdk-headless) and put "
                "javac on PATH or set JAVA_HOME")
        jars = Path(pyspark.__file__).parent / "jars"
        self.announce(f"compiling {SOURCE.name} against PySpark {pyspark.__version__} "
                      f"({jars}) with {' '.join(compiler)}", level=2)
        try:
            jvm_compile.compile_jar(compiler, SOURCE, jars, target / "exactly-state-writer.jar")
        except jvm_compile.CompileError as exc:
            raise SystemExit(str(exc)) from None
        metadata = {"pyspark": pyspark.__version__,
                    "source_sha256": jvm_compile.source_sha256(SOURCE),
                    "java_release": jvm_compile.JAVA_RELEASE}
        (target / "exactly-state-writer.json").write_text(json.dumps(metadata, indent=2) + "\n")


setup(cmdclass={"build_py": BuildPyWithStateWriter})
