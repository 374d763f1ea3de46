"""Object stores: the only package that imports boto3."""

from tierfs.store.base import ListPage, ObjectInfo, ObjectStore

__all__ = ["ListPage", "ObjectInfo", "ObjectStore"]
