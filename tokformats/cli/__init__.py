"""The command line, ``tokformats ...`` (``python -m tokformats``): :mod:`.parser` declares the subcommands,
:mod:`.commands` runs them, :mod:`.quickstart` is the tour on built-in sample text.

Every subcommand prints a one-line error and exits 2 on bad input (never a traceback); messages name command-line
flags (``--overwrite``), not Python keywords; ``--json`` prints what scripts need.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any, TextIO

from ..errors import FormatError, command_line_flags
from . import commands
from .parser import build_parser, flags

__all__ = ["main", "build_parser"]


def _show_warning(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, file: TextIO | None = None,
    line: str | None = None, *_: Any,
) -> None:
    """Print a warning raised while a command runs as ``warning: MESSAGE``, once."""
    commands.print_warning(str(message))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status: 0 success, 1 problems found (verify), 2 bad input or
    arguments (one line on stderr), 130 interrupted."""
    parser = build_parser()
    args = parser.parse_args(argv)
    commands._shown_warnings.clear()
    try:
        with command_line_flags(flags(parser, args.command)), warnings.catch_warnings():
            warnings.showwarning = _show_warning  # one line, once: not Python's source line of the library
            status: int = args.run(args)
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("\ntokformats: interrupted.", file=sys.stderr)
        return 130
    except (FormatError, OSError, ValueError, ImportError) as exc:  # bad input, a missing file or extra: one line
        if os.environ.get("TOKFORMATS_DEBUG"):
            raise
        print(f"tokformats: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug: say so, without burying the message under a traceback
        if os.environ.get("TOKFORMATS_DEBUG"):
            raise
        print(
            f"tokformats: internal error ({type(exc).__name__}: {exc}); please report it. "
            "TOKFORMATS_DEBUG=1 shows the traceback.",
            file=sys.stderr,
        )
        return 3
    return status
