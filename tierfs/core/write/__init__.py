"""The write path: local changes, the journal, and carrying it to the bucket.

* ``writes``: POSIX mutations: create, write, truncate, unlink, rename,
  attributes.
* ``blockwrites``: the blocks of a write: write, truncate, seal, and the
  commit of a file's writes.
* ``journal``: the bucket's changes still owed, durable in LMDB, and the
  order they may run in.
* ``sync``: carrying journal entries to the bucket (uploads, copies,
  markers, metadata) and waiting for them (flush); ``upload_source``
  reads a file's bytes for an upload.
* ``damage``: what a block that fails its checksum does.
* ``sharewrites``: files this node uploaded, copied into the shared tier.
"""
