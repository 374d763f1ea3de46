"""The write path: a file's bytes, and carrying the journal to the bucket.

* ``writes``: the data path of a file: write, truncate, fsync, flush.
* ``blockwrites``: the blocks of a write: write, truncate, seal, and the
  commit of a file's writes.
* ``sync``: carrying journal entries to the bucket (uploads, copies,
  markers, metadata) and waiting for them (flush); ``upload_source``
  reads a file's bytes for an upload.
* ``damage``: what a block that fails its checksum does.
* ``sharewrites``: files this node uploaded, copied into the shared tier.
"""
