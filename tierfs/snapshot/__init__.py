"""Dataset snapshots: a named, recorded view of a bucket that a mount can
show exactly as it was.

- ``record``: the record's layout in the bucket (parts and a manifest), its
  writer and its reader; a snapshot exists iff its manifest does.
"""
