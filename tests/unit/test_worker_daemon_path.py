"""Which sys.path entries exactly's worker daemon moves behind the installed PySpark."""

from __future__ import annotations

from exactly.spark.worker_daemon import prefer_installed_pyspark


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
