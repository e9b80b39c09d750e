"""What the ``s3://`` backend reads from boto3's responses: each response parsed once, here, into a record
whose fields name what S3 calls them (``ETag``, ``ContentLength`` ...); other fields are ignored."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tasks.core.storage.objects import ListedObject, ObjectInfo


class _Response(BaseModel):
    model_config = ConfigDict(frozen=True)


class Written(_Response):
    """The answer to a PUT, an uploaded part or a completed multipart upload: the version written."""

    etag: str = Field(alias="ETag")


class Head(Written):
    """The answer to a HEAD."""

    size: int = Field(alias="ContentLength")

    def info(self, uri: str) -> ObjectInfo:
        return ObjectInfo(uri, self.size, self.etag)


class Got(Written):
    """The answer to a GET: the version read, and its body (a botocore ``StreamingBody``)."""

    body: Any = Field(alias="Body")


class Upload(_Response):
    """The answer to the start of a multipart upload."""

    upload_id: str = Field(alias="UploadId")


class Listed(_Response):
    """One object of a listing."""

    key: str = Field(alias="Key")
    size: int = Field(alias="Size")
    modified: datetime = Field(alias="LastModified")
    etag: str = Field(alias="ETag")

    def listed(self, bucket: str) -> ListedObject:
        return ListedObject(f"s3://{bucket}/{self.key}", self.size, self.modified.astimezone(UTC), self.etag)


class Page(_Response):
    """One page of a listing (``list_objects_v2``); an empty one has no ``Contents``."""

    contents: list[Listed] = Field(default_factory=list, alias="Contents")
