"""Before anything starts on a checkpoint on S3: can this process reach it?

:func:`check_reachable` turns what would otherwise surface as a botocore traceback (or a
Spark stack trace minutes later, on the executors) into one line that names the setting to
fix: no credentials, an endpoint that is not an http(s) URL or does not answer, a bucket that
does not exist or that the credentials may not use. A local checkpoint needs no check.
"""

from __future__ import annotations

import os
from typing import Any

from exactly.checkpoint.location import checkpoint_uri
from exactly.checkpoint.store import S3LogStore, is_remote
from exactly.errors import ConfigError
from exactly.objectstore import checked_endpoint

#: seconds a check waits for the endpoint: a reachable store answers in milliseconds
CONNECT_TIMEOUT_S = 3.0


def check_reachable(checkpoint: str) -> None:
    """Raise ConfigError (one line, naming the ``AWS_*`` setting or the URI part to fix)
    unless the S3 bucket of ``checkpoint`` answers to this process's credentials. Nothing is
    written; a local checkpoint passes at once."""
    if not is_remote(checkpoint):
        return
    uri = checkpoint_uri(checkpoint)
    store = S3LogStore(uri)
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        try:
            checked_endpoint(endpoint, os.environ.get("AWS_ALLOW_HTTP"))
        except ConfigError as exc:
            raise ConfigError(f"checkpoint {uri}: {exc}") from None
    import boto3
    from botocore.config import Config
    from botocore.exceptions import (
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        NoRegionError,
    )

    session = boto3.session.Session()
    if session.get_credentials() is None:
        raise ConfigError(f"checkpoint {uri}: no S3 credentials; set AWS_ACCESS_KEY_ID and "
                          "AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for a store other "
                          "than AWS S3)")
    if not endpoint and not session.region_name:
        raise ConfigError(f"checkpoint {uri}: no S3 region; set AWS_REGION (or "
                          "AWS_ENDPOINT_URL for a store other than AWS S3)")
    where = f"the S3 endpoint {endpoint} (AWS_ENDPOINT_URL)" if endpoint else "AWS S3"
    client: Any = session.client(
        "s3", endpoint_url=endpoint or None,
        config=Config(s3={"addressing_style": "path"}, connect_timeout=CONNECT_TIMEOUT_S,
                      read_timeout=CONNECT_TIMEOUT_S * 2, retries={"max_attempts": 1}))
    try:
        client.head_bucket(Bucket=store.bucket)
    except (EndpointConnectionError, NoRegionError) as exc:
        raise ConfigError(f"checkpoint {uri}: cannot reach {where}: {exc}") from None
    except NoCredentialsError:
        raise ConfigError(f"checkpoint {uri}: no S3 credentials; set AWS_ACCESS_KEY_ID and "
                          "AWS_SECRET_ACCESS_KEY") from None
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status == 404:
            raise ConfigError(f"checkpoint {uri}: the bucket {store.bucket!r} does not exist "
                              f"at {where}; create it, or name an existing bucket in the "
                              "checkpoint URI") from None
        if status in (401, 403):
            raise ConfigError(f"checkpoint {uri}: the credentials of AWS_ACCESS_KEY_ID may "
                              f"not use the bucket {store.bucket!r} at {where} (HTTP "
                              f"{status}); check the key and the bucket's policy") from None
        raise ConfigError(f"checkpoint {uri}: {where} refused the bucket {store.bucket!r}: "
                          f"{exc}") from None
    except Exception as exc:  # a connection reset, a proxy, a TLS failure
        raise ConfigError(f"checkpoint {uri}: cannot reach {where}: "
                          f"{type(exc).__name__}: {exc}") from None
