"""A NeuroShard node's view of a shard folder: its assigned shards in turn, rotated when exhausted or asked."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, NoFilesError
from ..formats import pt
from ..fs.paths import is_url

__all__ = ["ShardRotation"]


class ShardRotation(Iterator[np.ndarray]):
    """Batches from the shards a node is assigned (:func:`tokformats.pt.assigned_shards`), one shard at a time.

    Each batch is ``batch_size`` rows of ``sequence_length + 1`` consecutive ids (inputs ``[:, :-1]``, targets
    ``[:, 1:]``) read in order from the current shard; when the shard has no room for another batch, the node
    moves on to its next assigned shard (after the last, back to the first). :meth:`rotate` moves on at once,
    for the training loop's own rule (Genesis rotates on a loss plateau). Only the assigned shards are opened,
    one at a time. The iterator never ends; :meth:`state_dict` / :meth:`load_state_dict` resume it exactly.

    Args:
        folder: the shard folder (``shard_N.pt`` + ``manifest.json``), a node's cache of part of it, or its URL
            (``https://.../genesis/``, ``s3://...``): then only the manifest and the node's shards are downloaded,
            into the verified cache (``remote=`` options: ``cache_dir``, ``max_cache_bytes``, ``offline``).
        node_id: the node's id, as Genesis hashes it.
        batch_size / sequence_length: the shape of each batch (rows of ``sequence_length + 1`` ids).
        count: how many shards a node takes (Genesis: 10).
        num_shards: the total the assignment is taken over (default: the manifest's ``total_shards``, else the
            highest shard number found + 1).
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        node_id: str,
        batch_size: int,
        sequence_length: int,
        *,
        count: int = 10,
        num_shards: int | None = None,
        remote: dict[str, Any] | None = None,
    ) -> None:
        if batch_size <= 0 or sequence_length <= 0:
            raise ConfigError(f"batch_size ({batch_size}) and sequence_length ({sequence_length}) must be positive.")
        if is_url(folder):
            from ..remote import fetch

            url = str(folder) if str(folder).endswith("/") else f"{folder}/"
            index = fetch(url, names=[], **(remote or {}))  # the manifest alone
            manifest = pt.read_manifest(index.cache.folder) or {}
            total = num_shards or int(manifest.get("total_shards") or 0)
            assigned = pt.assigned_shards(node_id, total, count) if total > 0 else []
            folder = fetch(url, names=[f"shard_{s}.pt" for s in assigned], **(remote or {})).cache.folder
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise NoFilesError(f"{self.folder} is not a shard folder.")
        self.node_id, self.batch_size, self.sequence_length = node_id, int(batch_size), int(sequence_length)
        self._files = dict(pt.shard_files(self.folder))
        if num_shards is None:
            manifest = pt.read_manifest(self.folder) or {}
            num_shards = int(manifest.get("total_shards") or (max(self._files) + 1 if self._files else 0))
        if num_shards <= 0:
            raise NoFilesError(f"{self.folder} holds no shard_N.pt files and its manifest names no shards.")
        #: The node's shards, in the order it takes them.
        self.shards = pt.assigned_shards(node_id, num_shards, count)
        missing = [s for s in self.shards if s not in self._files]
        if missing:
            raise NoFilesError(
                f"{self.folder} lacks the shards assigned to node {node_id!r}: "
                + ", ".join(f"shard_{s}.pt" for s in missing)
                + "."
            )
        self._turn = 0  # index into self.shards
        self.position = 0  # next token of the current shard
        self._tokens: np.ndarray | None = None

    @property
    def current_shard(self) -> int:
        """The number N of the ``shard_N.pt`` being read."""
        return self.shards[self._turn]

    def _shard_tokens(self) -> np.ndarray:
        if self._tokens is None:
            with pt.FileReader(self._files[self.current_shard]) as reader:
                self._tokens = np.asarray(reader.tokens)
        return self._tokens

    def rotate(self) -> int:
        """Move to the next assigned shard (from its start); returns its number."""
        self._turn = (self._turn + 1) % len(self.shards)
        self.position = 0
        self._tokens = None
        return self.current_shard

    def __iter__(self) -> ShardRotation:
        return self

    def __next__(self) -> np.ndarray:
        need = self.batch_size * self.sequence_length + 1
        for _ in range(len(self.shards) + 1):
            tokens = self._shard_tokens()
            if self.position + need <= len(tokens):
                break
            self.rotate()
        else:
            raise ConfigError(
                f"none of node {self.node_id!r}'s shards {self.shards} holds {need:,} tokens, the size of one batch "
                f"of {self.batch_size} x {self.sequence_length} + 1."
            )
        start = self.position
        rows = start + self.sequence_length * np.arange(self.batch_size)[:, None] + np.arange(self.sequence_length + 1)
        self.position += self.batch_size * self.sequence_length
        batch: np.ndarray = tokens[rows].astype(np.int64)
        return batch

    def state_dict(self) -> dict[str, Any]:
        """JSON-able position: which shard and token, and what the assignment was."""
        return {
            "node_id": self.node_id,
            "shards": list(self.shards),
            "shard": self.current_shard,
            "position": self.position,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the saved shard and token; refuses a state of another node or assignment."""
        if state.get("node_id") != self.node_id or list(state.get("shards", [])) != self.shards:
            raise ConfigError(
                f"this state is for node {state.get('node_id')!r} with shards {state.get('shards')}, not node "
                f"{self.node_id!r} with shards {self.shards}."
            )
        self._turn = self.shards.index(int(state["shard"]))
        self.position = int(state["position"])
        self._tokens = None
