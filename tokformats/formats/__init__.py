"""One module per on-disk format, each holding that format's ``Reader``, ``Writer`` and ``detect``."""
