"""The trace formats kvtier reads, by name: the one list the readers
(``kvtier.policy.readers.READERS``, ``FORMATS``) and the command line's ``--format`` read.
Standard library only and outside ``readers/`` (whose package imports numpy), so
``kvtier --help`` stays fast. A new reader adds its line here and its import in
``readers/__init__.py``."""

READER_CLASSES = {"mooncake": "MooncakeReader", "weka": "WekaReader",
                  "bailian": "BailianReader", "lmcache": "LmcacheReader"}
STORE = "store"  # a store or Parquet segments, read by kvtier.collector.reader
FORMATS = (*READER_CLASSES, STORE)
