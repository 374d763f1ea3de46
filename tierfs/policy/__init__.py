"""Pure lifecycle policy: no I/O, no trio, no lmdb, no boto3 (see tests/unit/test_import_rules.py).

* ``rules``: ``[[rules]]`` compiled once; ``RuleSet.match_path`` (first match wins).
* ``watermarks``: watermark arithmetic (``TierUsage``).
* ``eviction``: S3-FIFO (``S3FifoTracker``), LRU for comparison, and the helpers of the eviction bookkeeping.
* ``planner``: tier states + file facts + rules -> ``Move`` list; ``summarize``.
* ``simulate``: trace replay for the scan scenario (tests, benchmark).
"""
