"""A tokenize run's work folder (``OUTPUT.tokenize``): owned by one run at a time, started over or kept for a
resume, and removed once the outputs are written; the run's own ``OSError`` s name the output asked for."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..core.protocol import TokenWriter
from ..errors import FormatError, OutputExistsError, option
from ..fs.atomic import naming_output
from ..fs.owner import LOCK_NAME, owned_folder

__all__ = ["PARTITION_WAIT", "check_outputs", "errors_naming_output", "owned_work_folder", "remove_work_folder"]

#: Seconds a partition's folder is waited for while a killed run's orphaned worker may still write it (when a
#: partition is encoded, :mod:`.partition_run`, and when ``overwrite`` starts a failed run over, here).
PARTITION_WAIT = 60.0


@contextlib.contextmanager
def owned_work_folder(work: Path) -> Iterator[None]:
    """Own the run's work folder for the block: a second run on the same output is refused at once (naming the
    folder) rather than made to wait, since its work would be the first's to redo; a folder left holding nothing
    but the lock (a run refused before any work, e.g. for its tokenizer or options) is removed, and so are the
    folders above it that were made for it and are still empty."""
    made = [folder for folder in (work, *work.parents) if not folder.exists()]  # the nearest first
    with owned_folder(work, what="tokenize run"):
        try:
            yield
        finally:
            if work.is_dir() and not _unfinished(work):
                with contextlib.suppress(OSError):
                    (work / LOCK_NAME).unlink()
                    work.rmdir()
                    for folder in made[1:]:  # stops at the first that holds anything (rmdir refuses it)
                        folder.rmdir()


@contextlib.contextmanager
def errors_naming_output(output: Any) -> Iterator[None]:
    """An ``OSError`` of the run's own files (a full disk while spooling or writing) names the output asked for,
    not a spool or temporary file inside the work folder (or nothing, as a failed ``write`` does)."""
    try:
        yield
    except OSError as error:
        if isinstance(error, FormatError) or error.errno is None:
            raise
        if error.filename is not None and ".tokenize" not in str(error.filename):
            raise
        raise naming_output(error, output)  # noqa: B904 - the original is kept as the cause


def _unfinished(work: Path) -> bool:
    """Whether the work folder holds anything of a run (more than its lock)."""
    return work.is_dir() and any(entry.name != LOCK_NAME for entry in work.iterdir())


def check_outputs(
    writer_class: type[TokenWriter], targets: dict[tuple[str, str], Path], work: Path, *, overwrite: bool, resume: bool
) -> None:
    """Refuse outputs that exist (before any work is done), unless replacing or resuming; ``overwrite`` without
    ``resume`` starts a failed run's work folder over (keeping the lock this run holds)."""
    if overwrite and not resume and _unfinished(work):
        for entry in work.iterdir():
            if entry.name == LOCK_NAME:
                continue
            if entry.is_dir() and not entry.is_symlink():
                # a killed run's orphaned worker may still be writing there: wait for it to be gone first
                with owned_folder(entry, wait=PARTITION_WAIT, what="worker encoding this partition"):
                    shutil.rmtree(entry)
            else:
                entry.unlink()
    if overwrite or (resume and _unfinished(work)):
        return
    for target in targets.values():
        for path in writer_class.existing_outputs(target):
            raise OutputExistsError(
                f"{path} already exists; pass {option('overwrite')} to replace it (nothing was written)."
            )


def remove_work_folder(work: Path) -> None:
    """Remove a finished run's work folder: renamed away in one step first, so that a kill during the removal
    never leaves a half-deleted folder that a resume could take for an unfinished run."""
    from ..fs.journal import dead_temporaries, temporary_name

    trash = temporary_name(work, "tmp")
    try:
        os.replace(work, trash)
    except OSError:
        trash = work
    for folder in [trash, *dead_temporaries(work)]:  # and what earlier runs killed while removing left
        shutil.rmtree(folder, ignore_errors=True)
