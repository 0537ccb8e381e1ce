"""The Python workers of a session made by spark_session load PySpark from its installed
package (cached bytecode), not from the zip Spark puts first on their path."""

from __future__ import annotations

from pyspark.sql.functions import udf


def test_task_workers_import_pyspark_from_the_installed_package(spark):
    @udf("string")
    def origin(_):
        import sys

        return sys.modules["pyspark"].__file__

    where = {row[0] for row in spark.range(4).select(origin("id")).collect()}
    assert len(where) == 1, where
    (path,) = where
    assert ".zip" not in path and path.endswith("pyspark/__init__.py"), path
