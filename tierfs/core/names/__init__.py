"""The namespace: the bucket's keys as directories and files.

* ``namespace``: lookups, paths, walks, revalidation of a file on open;
  what a reader sees of other writers ("Consistency a reader gets").
* ``listings``: directories listed lazily from the bucket into LMDB,
  re-listing after ``list_ttl``, the attributes of listed names.
* ``inodekeys``: inodes by number and their object keys.
* ``namereads``: what the kernel reads of names: lookup, getattr, readdir,
  with ``dirhandles`` (stable readdir offsets) and ``attrcache`` (the
  attributes readdir hands out).
* ``changes``: where names change: create, mkdir, symlink, mknod, link,
  unlink, rmdir, rename, setattr, extended attributes; each with its bucket
  side in the journal, in one transaction.
* ``quotas``: directory quotas: usage from a background count of the
  bucket plus this node's uncounted changes, EDQUOT before a change lands.
* ``access``: permission checks of a caller outside the kernel (the control
  socket, fast readers): may it search, read, write this file?
* ``shadow``: non-default attributes kept in the bucket as shadow objects.
* ``posix_attrs``: permission and attribute rules, access times, inodes
  removed while the kernel holds them.
"""
