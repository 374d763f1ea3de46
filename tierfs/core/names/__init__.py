"""The namespace: the bucket's keys as directories and files.

* ``namespace``: lookups, paths, walks, revalidation of a file on open;
  what a reader sees of other writers ("Consistency a reader gets").
* ``listings``: directories listed lazily from the bucket into LMDB,
  re-listing after ``list_ttl``, the attributes of listed names.
* ``inodekeys``: inodes by number and their object keys.
* ``namereads``: what the kernel reads of names: lookup, getattr, readdir,
  with ``dirhandles`` (stable readdir offsets) and ``attrcache`` (the
  attributes readdir hands out).
* ``shadow``: non-default attributes kept in the bucket as shadow objects.
* ``posix_attrs``: permission and attribute rules, access times, inodes
  removed while the kernel holds them.
"""
