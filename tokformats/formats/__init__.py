"""One module per on-disk format, each holding that format's ``Reader``, ``Writer``, ``detect`` and everything else
that is true of that format only (output names, boundaries convention, the files that go with a URL, ...).

A module that declares a ``DESCRIPTOR`` (a :class:`tokformats.registry.FormatDescriptor`) is a built-in format: the
registry finds it here the first time the table is used. Adding a format is its module and its tests (outside
tokformats: a module and a ``tokformats.formats`` entry point).
"""
