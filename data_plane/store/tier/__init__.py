"""Tiered storage: sealed CommitLog files copied to S3-compatible object storage and read back
when their local copies are gone (docs/tiered_storage.md).

    object_store.py   boto3: verified multipart uploads, ranged GETs, the manifest object
    manifest.py       which files the bucket holds, per broker group
    offload.py        the master's thread: upload, tier retention; a slave's: follow the manifest
    chunk_cache.py    cold reads: chunks in memory and on local disk, read-ahead
    tier.py           the store's handle on all of it (``MessageStore.tier``)

The ConsumeQueues and IndexFiles stay on local disk for a message's whole retention (20 bytes a
message, and an entry a key): they are what finds a tiered message. Only the CommitLog — the
messages themselves — leaves.
"""
