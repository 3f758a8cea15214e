"""The object store a tier talks to: an S3-compatible bucket through boto3, with what the tier
needs and nothing else — verified multipart uploads of files, ranged reads, small JSON
objects, deletes, and the cleanup of uploads a crash left behind.

Every call blocks: callers run them on worker threads, never on the broker's event loop.
Credentials come from boto3's usual chain (environment, shared files, instance roles), or a
named profile of the shared files (``tier_profile``).
"""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import botocore.config
import botocore.exceptions

log = logging.getLogger(__name__)


class ObjectStoreError(Exception):
    """The object store could not do what was asked (unreachable, refused, or a mismatch)."""


@dataclass(frozen=True, slots=True)
class Uploaded:
    key: str
    size: int
    etag: str  # as S3 computes it for a multipart upload: md5(part md5s) + "-" + parts


def multipart_etag(part_md5s: list[bytes]) -> str:
    """The ETag S3 gives an object uploaded in parts with these MD5s (unencrypted or SSE-S3)."""
    return f'"{hashlib.md5(b"".join(part_md5s)).hexdigest()}-{len(part_md5s)}"'


class Pace:
    """At most ``bytes_per_s`` over the life of the pace (0: no limit): ``take(n)`` sleeps until
    the ``n`` bytes fit the schedule that began with the first ``take``. A bound on an upload's
    bandwidth, and so on the CPU and network it takes from the hot path at any moment."""

    def __init__(self, bytes_per_s: int) -> None:
        self.bytes_per_s = bytes_per_s
        self._began = 0.0
        self._taken = 0

    def take(self, n: int) -> None:
        if self.bytes_per_s <= 0:
            return
        now = time.monotonic()
        if not self._taken:
            self._began = now
        self._taken += n
        ahead = self._taken / self.bytes_per_s - (now - self._began)
        if ahead > 0:
            time.sleep(ahead)


class PacedBody(io.BytesIO):
    """A part's bytes as the HTTP client reads them, each read waiting its turn on ``pace``: the
    upload goes out smoothly, never in bursts of a part. Reads of ``UNPACED_READ`` or more are
    not paced: over http:// botocore's signer reads the whole body in 1 MiB reads to hash it
    before it is sent (the HTTP client reads 8-64 KiB at a time), and only the bytes going out
    count against the bandwidth."""

    UNPACED_READ = 1024 * 1024

    def __init__(self, data: bytes, pace: Pace) -> None:
        super().__init__(data)
        self._pace = pace

    def read(self, size: int | None = -1, /) -> bytes:
        out = super().read(size)
        if size is not None and 0 <= size < self.UNPACED_READ:
            self._pace.take(len(out))
        return out


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a bucket is and how to reach it: what a worker process needs to open the same store."""

    bucket: str
    endpoint_url: str = ""
    region: str = "us-east-1"
    profile: str = ""
    timeout_s: float = 10.0


class ObjectStore:
    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str = "",
        region: str = "us-east-1",
        profile: str = "",
        timeout_s: float = 10.0,
    ) -> None:
        self.endpoint = Endpoint(bucket, endpoint_url, region, profile, timeout_s)
        cfg = botocore.config.Config(
            region_name=region or None,
            connect_timeout=timeout_s,
            read_timeout=timeout_s,
            retries={"max_attempts": 3, "mode": "standard"},
            max_pool_connections=16,
            # Every part already carries its MD5, which the store checks: no second checksum of
            # each body (botocore's default CRC32 pass holds the GIL, ~0.3 ms a MiB, and was 8 %
            # of an upload's CPU; benchmarks/tier.py).
            request_checksum_calculation="when_required",
        )
        try:
            session = boto3.session.Session(profile_name=profile or None)
        except botocore.exceptions.ProfileNotFound as e:
            raise ObjectStoreError(f"tier_profile: {e}") from None
        self._s3: Any = session.client("s3", endpoint_url=endpoint_url or None, config=cfg)

    @property
    def bucket(self) -> str:
        return self.endpoint.bucket

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        try:
            return fn(Bucket=self.bucket, **kwargs)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise ObjectStoreError(
                f"{what} s3://{self.bucket}/{kwargs.get('Key', kwargs.get('Prefix', ''))}: {e}"
            ) from e

    # --- whole objects -------------------------------------------------------------------------
    def put_bytes(self, key: str, data: bytes) -> None:
        md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
        self._call("PUT", self._s3.put_object, Key=key, Body=data, ContentMD5=md5)

    def get_bytes(self, key: str) -> bytes | None:
        """The object's bytes, or None when there is no such object."""
        try:
            r = self._s3.get_object(Bucket=self.bucket, Key=key)
            return bytes(r["Body"].read())
        except botocore.exceptions.ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise ObjectStoreError(f"GET s3://{self.bucket}/{key}: {e}") from e
        except botocore.exceptions.BotoCoreError as e:
            raise ObjectStoreError(f"GET s3://{self.bucket}/{key}: {e}") from e

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes of the object from ``start`` (a ranged GET); fewer only past its end."""
        r = self._call("GET", self._s3.get_object, Key=key, Range=f"bytes={start}-{start + length - 1}")
        try:
            return bytes(r["Body"].read())
        except (botocore.exceptions.BotoCoreError, OSError) as e:
            raise ObjectStoreError(f"GET s3://{self.bucket}/{key} (reading the body): {e}") from e

    def head(self, key: str) -> tuple[int, str] | None:
        """(size, ETag) of the object, or None when there is none."""
        try:
            r = self._s3.head_object(Bucket=self.bucket, Key=key)
        except botocore.exceptions.ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return None
            raise ObjectStoreError(f"HEAD s3://{self.bucket}/{key}: {e}") from e
        except botocore.exceptions.BotoCoreError as e:
            raise ObjectStoreError(f"HEAD s3://{self.bucket}/{key}: {e}") from e
        return int(r["ContentLength"]), str(r["ETag"])

    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):  # DeleteObjects takes up to 1,000 keys
            batch = [{"Key": k} for k in keys[i : i + 1000]]
            r = self._call("DELETE", self._s3.delete_objects, Delete={"Objects": batch, "Quiet": True})
            if r.get("Errors"):
                first = r["Errors"][0]
                raise ObjectStoreError(f"DELETE s3://{self.bucket}/{first.get('Key')}: {first.get('Message')}")

    # --- uploads -------------------------------------------------------------------------------
    @classmethod
    def at(cls, e: Endpoint) -> ObjectStore:
        return cls(e.bucket, endpoint_url=e.endpoint_url, region=e.region, profile=e.profile, timeout_s=e.timeout_s)

    def upload_file(self, key: str, path: str, length: int, part_bytes: int, bytes_per_s: int = 0) -> Uploaded:
        """The first ``length`` bytes of ``path`` as object ``key``, in parts of ``part_bytes``:
        each part carries its MD5 (the store checks it), and the object's size and ETag are
        checked against what was sent once it is complete. At most ``bytes_per_s`` on the wire
        (0: as fast as it goes). Raises ObjectStoreError; a failed upload is aborted."""
        pace = Pace(bytes_per_s)
        r = self._call("CreateMultipartUpload", self._s3.create_multipart_upload, Key=key)
        upload_id = r["UploadId"]
        try:
            parts = []
            md5s = []
            with open(path, "rb", buffering=0) as f:
                pos = 0
                number = 1
                while pos < length or number == 1:
                    n = min(part_bytes, length - pos)
                    data = os.pread(f.fileno(), n, pos)
                    if len(data) != n:
                        raise ObjectStoreError(f"{path}: read {len(data)} of {n} bytes at {pos}")
                    digest = hashlib.md5(data).digest()
                    body = PacedBody(data, pace) if bytes_per_s > 0 else data
                    got = self._call(
                        "UploadPart", self._s3.upload_part, Key=key, UploadId=upload_id, PartNumber=number,
                        Body=body, ContentMD5=base64.b64encode(digest).decode(),
                    )  # fmt: skip
                    parts.append({"PartNumber": number, "ETag": got["ETag"]})
                    md5s.append(digest)
                    pos += n
                    number += 1
            done = self._call(
                "CompleteMultipartUpload", self._s3.complete_multipart_upload, Key=key, UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            )  # fmt: skip
        except BaseException:
            try:
                self._s3.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            except Exception as e:  # the store is away: a later start aborts it (abort_stale_uploads)
                log.info("could not abort the upload of %s: %s", key, e)
            raise
        expected = multipart_etag(md5s)
        seen = self.head(key)
        if seen is None or seen[0] != length or seen[1] != expected or done.get("ETag", expected) != expected:
            raise ObjectStoreError(
                f"s3://{self.bucket}/{key} does not match what was uploaded: sent {length} bytes, ETag {expected}; "
                f"the store has {seen}"
            )
        return Uploaded(key, length, expected)

    def stale_uploads(self, prefix: str) -> Iterator[tuple[str, str]]:
        """(key, upload id) of every multipart upload begun under ``prefix`` and never finished."""
        kwargs: dict[str, Any] = {"Prefix": prefix}
        while True:
            r = self._call("ListMultipartUploads", self._s3.list_multipart_uploads, **kwargs)
            for u in r.get("Uploads", []):
                yield u["Key"], u["UploadId"]
            if not r.get("IsTruncated"):
                return
            kwargs["KeyMarker"] = r.get("NextKeyMarker", "")
            kwargs["UploadIdMarker"] = r.get("NextUploadIdMarker", "")

    def abort_upload(self, key: str, upload_id: str) -> None:
        self._call("AbortMultipartUpload", self._s3.abort_multipart_upload, Key=key, UploadId=upload_id)

    def list_keys(self, prefix: str) -> list[str]:
        out: list[str] = []
        kwargs: dict[str, Any] = {"Prefix": prefix}
        while True:
            r = self._call("ListObjectsV2", self._s3.list_objects_v2, **kwargs)
            out += [o["Key"] for o in r.get("Contents", [])]
            if not r.get("IsTruncated"):
                return out
            kwargs["ContinuationToken"] = r["NextContinuationToken"]
