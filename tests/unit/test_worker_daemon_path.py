"""Which sys.path entries exactly moves behind the installed PySpark, in its worker daemon and
in the sitecustomize of every other Python process Spark starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from exactly.spark.pyspark_path import SITE_DIR, prefer_installed_pyspark


def test_an_installed_pysparks_zips_move_behind_site_packages(tmp_path):
    site = tmp_path / "site-packages"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    zips = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    path = [*zips, "/opt/job", str(site)]
    assert prefer_installed_pyspark(path) == ["/opt/job", str(site), *zips]


def test_a_spark_distributions_zips_stay_first(tmp_path):
    """A Spark distribution's python/lib has no installed package to prefer."""
    lib = tmp_path / "spark-4.3.0" / "python" / "lib"
    lib.mkdir(parents=True)
    path = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip"), "/site-packages"]
    assert prefer_installed_pyspark(path) == path


def test_sparks_python_processes_import_the_installed_pyspark_and_still_run_the_next_sitecustomize(
        tmp_path):
    """What Spark's planning workers get (Spark's zips first on PYTHONPATH, exactly's
    SITE_DIR behind them): PySpark comes from the installed package, and a sitecustomize
    further down the path still runs."""
    import pyspark

    lib = Path(pyspark.__file__).parent / "python" / "lib"
    zips = sorted(str(z) for z in lib.glob("*.zip"))
    assert zips, "an installed PySpark carries its zips"
    other = tmp_path / "other-site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITE_RAN'] = '1'\n")
    script = ("import os, pyspark; print(pyspark.__file__); "
              "print(os.environ.get('OTHER_SITE_RAN'))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*zips, SITE_DIR, str(other)])}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, check=True, cwd=tmp_path).stdout.split()
    assert out == [pyspark.__file__, "1"]
