"""The format-neutral model every format builds on: the Reader/Writer protocol, the format registry and its typed
format-module interface, token arrays, dtypes, document boundaries, and the reports (verify, stats) over any reader.

Nothing here knows a particular format, the network, tokenization or training.
"""
