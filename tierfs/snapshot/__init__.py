"""Dataset snapshots: a named, recorded view of a bucket that a mount can
show exactly as it was.

- ``record``: the record's layout in the bucket (parts and a manifest), its
  writer and its reader; a snapshot exists iff its manifest does.
- ``walk``: what a snapshot records, the bucket's objects under some paths
  in key order with their stored attributes (and version IDs on a bucket
  that keeps versions), and ``take_snapshot``;
- ``diff``: added, removed and changed names between two key-ordered views
  (two records, or a record and the live bucket), in one pass;
- ``check``: the recorded versions the bucket no longer keeps (expired by
  its lifecycle rules), in one pass over the record and the versions.
"""
