"""The command line, ``tokformats ...``: its parser, its commands and the quickstart tour (``python -m tokformats``)."""

from .commands import build_parser, main

__all__ = ["main", "build_parser"]
