"""Atomic commit of one or several output files.

A writer asks for a temporary file per output; everything is written there, in the destination
folder (so the final rename never crosses a file system). :meth:`AtomicFiles.commit` flushes,
fsyncs and renames every temporary into place, in the order they were created (a format whose
reader keys on one file, such as Megatron's ``.idx``, creates that one last), then fsyncs the
folders. A commit of several files goes through a journal (:mod:`tokformats.journal`), so that a
kill between two renames is completed by the next write or open there, never left half old, half
new. :meth:`AtomicFiles.abort` removes the temporaries and any folder made for them; it also
runs if the writer is garbage-collected without being closed. Readers therefore never see a
half-written dataset under its final name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

from ..errors import FormatError, OutputExistsError, option
from .journal import (
    finish_journal,
    folder_lock,
    fsync_folder,
    recover,
    remove_dead_temporaries,
    temporary_name,
    write_journal,
)

__all__ = ["AtomicFiles", "naming_output", "replace_file"]


def naming_output(error: OSError, output: str | os.PathLike[str]) -> OSError:
    """The same kind of ``OSError`` (ENOSPC, EROFS, EACCES, ...), naming the output the user asked for rather than
    the hidden temporary (or nothing, as a failed ``write`` does). A library error that is also an ``OSError``
    (:class:`~tokformats.errors.OutputExistsError`, :class:`~tokformats.errors.NoFilesError`) already names its
    file in a full sentence: it is returned as it is, never rebuilt from ``(errno, strerror, filename)``."""
    if isinstance(error, FormatError):
        return error
    if error.filename is not None and not str(error.filename).endswith((".tmp", ".spool")):
        return error
    renamed = type(error)(error.errno, error.strerror or str(error), os.fspath(output))
    renamed.__cause__ = error
    return renamed


def replace_file(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` in one commit: a reader sees the old file or the new one, never half of either
    (the file and its folder are fsynced)."""
    with AtomicFiles(overwrite=True) as files:
        files.create(path).write(data)


def _cleanup(handles: list[BinaryIO], temporaries: list[Path], made_dirs: list[Path], scratch: list[Path]) -> None:
    for handle in handles:
        with contextlib.suppress(OSError):
            handle.close()
    for tmp in (*temporaries, *scratch):
        tmp.unlink(missing_ok=True)
    for folder in reversed(made_dirs):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only succeeds when empty: never removes anything we did not make
    handles.clear()
    temporaries.clear()
    made_dirs.clear()
    scratch.clear()



class AtomicFiles:
    """A set of output files that appear under their final names all at once, or not at all.

    Args:
        overwrite: allow final names that already exist to be replaced.
    """

    def __init__(self, *, overwrite: bool = False) -> None:
        self.overwrite = overwrite
        self._finals: list[Path] = []
        self._final_set: set[Path] = set()
        self._temporaries: list[Path] = []
        self._handles: list[BinaryIO] = []
        self._made_dirs: list[Path] = []
        self._stale: list[Path] = []
        self._stale_sources: list[Callable[[], Iterable[Path]]] = []
        self._scratch: list[Path] = []
        #: The final paths of the last commit.
        self.committed: list[Path] = []
        self._finalizer = weakref.finalize(
            self, _cleanup, self._handles, self._temporaries, self._made_dirs, self._scratch
        )

    def __enter__(self) -> AtomicFiles:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """Commit when the block ends normally, abort (nothing appears) when it raises or the commit fails."""
        if exc_type is not None:
            self.abort()
            return
        try:
            self.commit()
        except BaseException:
            self.abort()
            raise

    def check_destination(self, final: str | os.PathLike[str]) -> None:
        """Refuse ``final`` if it exists and overwriting was not allowed (after completing any commit a killed
        writer left unfinished there)."""
        path = Path(final)
        recover(path.parent)
        if path.exists() and not self.overwrite:
            raise OutputExistsError(
                f"{path} already exists; pass {option('overwrite')} to replace it (nothing was written)."
            )

    def make_parent(self, final: Path) -> None:
        """Create ``final``'s folder (and its parents) if needed, remembering what to remove on abort."""
        missing = []
        folder = final.parent
        while not folder.exists():
            missing.append(folder)
            folder = folder.parent
        for folder in reversed(missing):
            folder.mkdir(exist_ok=True)
            self._made_dirs.append(folder)

    def create(self, final: str | os.PathLike[str]) -> BinaryIO:
        """Open a new temporary file that :meth:`commit` will rename to ``final``.

        The handle is opened for reading and writing so that a writer can seek back and patch a
        header once counts are known.
        """
        path = Path(final)
        self.check_destination(path)
        if path in self._final_set:
            raise ValueError(f"{path} was already created in this commit")
        self._final_set.add(path)
        tmp = temporary_name(path)
        try:
            remove_dead_temporaries(path)  # a killed writer's leftovers, never a live one's
            self.make_parent(path)
            handle = open(tmp, "w+b")  # noqa: SIM115 - closed by commit() or abort()
        except OSError as error:
            raise naming_output(error, path) from None
        self._finals.append(path)
        self._temporaries.append(tmp)
        self._handles.append(handle)
        return handle

    def finish(self, handle: BinaryIO) -> None:
        """Flush, fsync and close one temporary early (a completed shard), keeping it for the commit.

        Sharded writers call this so that only the shard being written holds a file descriptor.
        """
        if handle.closed:
            return
        handle.flush()
        os.fsync(handle.fileno())
        handle.close()

    def write_back(self) -> None:
        """Flush every temporary still open and write what it holds so far to the disk (``fdatasync``), leaving it
        open: a writer that is fed for a long time calls this between pieces, so that :meth:`commit`'s fsync has
        only the rest to write. Nothing else changes: the commit still fsyncs every file before the rename."""
        sync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
        for handle in self._handles:
            if not handle.closed:
                handle.flush()
                sync(handle.fileno())

    def adopt(self, final: str | os.PathLike[str], source: str | os.PathLike[str]) -> None:
        """Make the finished file ``source`` (left where it is) the content of ``final``, which :meth:`create` made
        and nothing was written to: its temporary becomes a hard link to ``source``, fsynced, so that the commit
        renames those bytes into place without copying them, and an abort (or a kill) leaves ``source`` whole.
        Raises ``OSError`` where that cannot be (no hard links on the file system, ``source`` on another one);
        nothing has changed then, and the caller writes the bytes itself."""
        path = Path(final)
        index = self._finals.index(path)
        handle, tmp = self._handles[index], self._temporaries[index]
        if handle.closed or handle.tell() or os.fstat(handle.fileno()).st_size:
            raise ValueError(f"{path} was written to; only an empty temporary can adopt a file")
        if path.exists() and os.path.samefile(source, path):
            # Already published (a resume after a kill between the commit and the cleanup): a rename between two
            # links of one file does nothing and would leave the temporary behind. The caller copies instead.
            raise FileExistsError(errno.EEXIST, "the source is already the final file", str(path))
        link = temporary_name(path)
        os.link(source, link)
        try:
            with open(link, "rb") as linked:  # the source's bytes reach the disk before the rename publishes them
                os.fsync(linked.fileno())
            os.replace(link, tmp)
        except BaseException:
            link.unlink(missing_ok=True)
            raise
        handle.close()

    def retarget(self, final: str | os.PathLike[str], new_final: str | os.PathLike[str]) -> None:
        """Give a created temporary another final name (for names known only at commit: data-K-of-N)."""
        old, new = Path(final), Path(new_final)
        self.check_destination(new)
        index = self._finals.index(old)
        self._finals[index] = new
        self._final_set.discard(old)
        self._final_set.add(new)

    def scratch(self, near: str | os.PathLike[str]) -> Path:
        """A path for a scratch file beside ``near`` that is deleted at commit and at abort (a spool)."""
        path = Path(near)
        self.make_parent(path)
        scratch = temporary_name(path, "spool")
        self._scratch.append(scratch)
        return scratch

    def remove_on_commit(self, paths: Iterable[Path] | Callable[[], Iterable[Path]]) -> None:
        """Delete these existing files when committing (stale shards of an overwritten dataset). A callable is
        asked at commit time, under the folder's lock, so that a concurrent writer's files are seen too."""
        if callable(paths):
            self._stale_sources.append(paths)
        else:
            self._stale.extend(paths)

    def commit(self) -> list[Path]:
        """Flush, fsync and rename every temporary into place; return the final paths."""
        for handle in self._handles:
            self.finish(handle)
        for final in self._finals:
            self.check_destination(final)  # something may have appeared while we were writing
        finals = list(self._finals)
        renames = list(zip(self._temporaries, finals))
        try:
            if finals and (len(renames) > 1 or self._stale or self._stale_sources):
                with folder_lock(finals[0].parent):  # one commit at a time into a folder
                    candidates = [*self._stale, *(p for source in self._stale_sources for p in source())]
                    stale = sorted({p for p in candidates if p not in finals and p.exists()})
                    journal = write_journal(finals[0].parent, renames, stale)
                    finish_journal(journal, renames, stale)
            else:
                for tmp, final in renames:
                    os.replace(tmp, final)
                for folder in {final.parent for final in finals}:
                    fsync_folder(folder)
        except OSError as error:
            raise naming_output(error, finals[0] if finals else "the output") from None
        for scratch in self._scratch:
            scratch.unlink(missing_ok=True)
        self._scratch.clear()
        self._handles.clear()
        self._temporaries.clear()
        self._made_dirs.clear()
        self._finals.clear()
        self._final_set.clear()
        self._finalizer.detach()
        self.committed = finals
        return finals

    def abort(self) -> None:
        """Remove every temporary (and folder made for them); nothing appears under a final name."""
        _cleanup(self._handles, self._temporaries, self._made_dirs, self._scratch)
        self._finals.clear()
        self._final_set.clear()
        self._finalizer.detach()
