"""PyTorch ``torch.save`` files, read and written with NumPy alone and without running pickled code.

Reading (:func:`load`): the zip container of torch >= 1.6 (every record stored, never compressed; data
offsets taken from each record's *local* header) and the legacy format of torch < 1.6 (five pickles, then
raw storages). ``data.pkl`` is read by :class:`SafeUnpickler`, whose ``find_class`` admits only the
globals a tensor needs and returns inert stand-ins; anything else raises before any code can run.
Storages are memory-mapped.

Writing (:func:`save`): one 1-D tensor, laid out exactly as ``torch.save`` lays it out (same record
order, 64-byte alignment by ``FB`` padding fields, data descriptors, zip64 end records), so that
``torch.load(weights_only=True)`` and ``torch.load(mmap=True)`` read it.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from ..core.arrays import map_file
from ..errors import DTypeError, FormatError, HeaderError, NoFilesError, SizeMismatchError, UnsafePickleError
from ..fs.paths import read_head

__all__ = ["TensorRef", "load", "save", "write_tensor", "is_torch_file", "SafeUnpickler", "ZIP_MAGIC", "LEGACY_MAGIC"]

ZIP_MAGIC = b"PK\x03\x04"
#: A protocol-2 legacy file starts with this pickle of the magic number 0x1950A86A20F9469CFC6C.
LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
LEGACY_MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
ALIGNMENT = 64

#: Typed storages (numel counts elements) and their NumPy dtypes.
STORAGE_DTYPES: dict[str, np.dtype] = {
    "LongStorage": np.dtype("<i8"),
    "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"),
    "CharStorage": np.dtype("i1"),
    "ByteStorage": np.dtype("u1"),
    "BoolStorage": np.dtype("?"),
    "FloatStorage": np.dtype("<f4"),
    "DoubleStorage": np.dtype("<f8"),
    "HalfStorage": np.dtype("<f2"),
}
#: ``torch.<dtype>`` globals (the 7th argument of ``_rebuild_tensor_v3``).
TORCH_DTYPES: dict[str, np.dtype] = {
    "uint8": np.dtype("u1"),
    "int8": np.dtype("i1"),
    "int16": np.dtype("<i2"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "uint16": np.dtype("<u2"),
    "uint32": np.dtype("<u4"),
    "uint64": np.dtype("<u8"),
    "float16": np.dtype("<f2"),
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "bool": np.dtype("?"),
}
_UNSUPPORTED = {"BFloat16Storage": "bfloat16", "bfloat16": "bfloat16", "ComplexFloatStorage": "complex64"}


# -- stand-ins produced by the safe unpickler -------------------------------------------------------


class _StorageType(NamedTuple):
    name: str
    dtype: np.dtype | None  # None: UntypedStorage (numel counts bytes)


class _TorchDType(NamedTuple):
    name: str
    dtype: np.dtype


class _StorageRef(NamedTuple):
    key: str
    storage_type: _StorageType
    numel: int


class TensorRef(NamedTuple):
    """A tensor as ``data.pkl`` describes it: which storage, and the view into it (all in elements)."""

    storage: _StorageRef
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: np.dtype


def _rebuild_v2(storage: Any, offset: Any, size: Any, stride: Any, *_: Any) -> TensorRef:
    return _tensor(storage, offset, size, stride, None)


def _rebuild_v3(
    storage: Any, offset: Any, size: Any, stride: Any, grad: Any, hooks: Any, dtype: Any, *_: Any
) -> TensorRef:
    if not isinstance(dtype, _TorchDType):
        raise UnsafePickleError(f"_rebuild_tensor_v3 expects a torch dtype, found {dtype!r}.")
    return _tensor(storage, offset, size, stride, dtype.dtype)


def _tensor(storage: Any, offset: Any, size: Any, stride: Any, dtype: np.dtype | None) -> TensorRef:
    if not isinstance(storage, _StorageRef):
        raise UnsafePickleError(f"a tensor must be rebuilt from a storage record, found {type(storage).__name__}.")
    if not (isinstance(offset, int) and isinstance(size, tuple) and isinstance(stride, tuple)):
        raise FormatError("a tensor's storage offset, size and stride must be an int and two tuples.")
    if len(size) != len(stride) or not all(isinstance(v, int) for v in (*size, *stride)):
        raise FormatError(f"a tensor's size {size} and stride {stride} do not match.")
    element = dtype if dtype is not None else storage.storage_type.dtype
    if element is None:
        raise FormatError("an UntypedStorage tensor must be rebuilt with _rebuild_tensor_v3 and a dtype.")
    return TensorRef(storage, offset, size, stride, element)


_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_v3,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch.storage", "UntypedStorage"): _StorageType("UntypedStorage", None),
    **{("torch", name): _StorageType(name, dtype) for name, dtype in STORAGE_DTYPES.items()},
    **{("torch", name): _TorchDType(name, dtype) for name, dtype in TORCH_DTYPES.items()},
}


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that resolves only tensor-rebuilding globals, to inert stand-ins; never imports torch."""

    def __init__(self, file: BinaryIO, *, where: str) -> None:
        super().__init__(file)
        self._where = where

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if (module, name) in {("torch", n) for n in _UNSUPPORTED}:
            raise DTypeError(f"{self._where}: {_UNSUPPORTED[name]} tensors have no NumPy dtype; convert them first.")
        raise UnsafePickleError(
            f"{self._where}: the pickle asks for the global {module}.{name}, which is not a tensor-rebuilding "
            "global; refused before anything ran. Only load such files with torch if you trust them."
        )

    def persistent_load(self, pid: Any) -> Any:
        # zip format: ('storage', type, key, location, numel); legacy: plus a view-metadata field.
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage"):
            raise UnsafePickleError(f"{self._where}: unexpected persistent id {pid!r}.")
        storage_type, key, numel = pid[1], pid[2], pid[4]
        if not isinstance(storage_type, _StorageType) or not isinstance(key, str) or not isinstance(numel, int):
            raise FormatError(f"{self._where}: malformed storage reference {pid!r}.")
        if len(pid) == 6 and pid[5] is not None:
            raise FormatError(f"{self._where}: legacy storage views are not supported ({pid!r}).")
        return _StorageRef(key, storage_type, numel)


#: Opcodes a pickle of tensors never needs. BUILD sets state on an object: on our allowed stand-ins it could
#: rewrite their attributes (even a function's ``__defaults__``) for the rest of the process.
_REFUSED_OPCODES = {"BUILD", "INST", "OBJ", "EXT1", "EXT2", "EXT4"}
_MEMO_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}
_MEMO_GETS = {"GET", "BINGET", "LONG_BINGET"}


class _Bounded:
    """A read-only view of a stream whose reads never ask for more than remains: ``read(n)`` of a file allocates
    ``n`` bytes before reading, so a declared length of 2**60 becomes a short read (which the pickle readers
    report as a truncated pickle), not a 1 EiB allocation."""

    def __init__(self, stream: BinaryIO, where: str) -> None:
        self._stream, self._where = stream, where
        here = stream.tell()
        self._end = stream.seek(0, os.SEEK_END)
        stream.seek(here)

    def read(self, size: int | None = -1) -> bytes:
        left = self._end - self._stream.tell()
        if size is None or size < 0:
            size = left
        return self._stream.read(min(size, left))

    def readline(self, size: int | None = -1) -> bytes:
        left = self._end - self._stream.tell()
        return self._stream.readline(left if size is None or size < 0 else min(size, left))

    def peek(self, size: int = 0) -> bytes:  # what the C unpickler asks of buffered files
        here = self._stream.tell()
        data = self._stream.read(max(size, 1))
        self._stream.seek(here)
        return data

    def tell(self) -> int:
        return self._stream.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._stream.seek(offset, whence)


def _prescan(data: Any, where: str) -> None:
    """Walk the pickle's opcodes before the unpickler runs: refuse opcodes tensors never need and memo indices
    that the pickle's own length cannot justify (CPython's unpickler sizes its memo by the largest index, so one
    ``LONG_BINPUT 2**28`` in a 223-byte file asks for gigabytes)."""
    import pickletools

    start = data.tell()
    memo = 0
    try:
        for opcode, arg, position in pickletools.genops(data):
            name = opcode.name
            if name in _REFUSED_OPCODES:
                raise UnsafePickleError(
                    f"{where}: the pickle uses {name} at byte {position}, which a torch.save of "
                    "tensors never writes; refused before anything ran."
                )
            if name in _MEMO_PUTS:
                if not isinstance(arg, int) or arg > memo:
                    raise FormatError(
                        f"{where}: the pickle stores memo entry {arg} at byte {position} after only "
                        f"{memo} entries; a pickler numbers them in order."
                    )
                memo = max(memo, arg + 1)
            elif name == "MEMOIZE":
                memo += 1
            elif name in _MEMO_GETS and (not isinstance(arg, int) or arg >= memo):
                raise FormatError(f"{where}: the pickle reads memo entry {arg} at byte {position}, never stored.")
    except FormatError:
        raise
    except (ValueError, EOFError) as exc:  # pickletools' words for truncated or unknown opcodes
        raise FormatError(f"{where}: the pickle cannot be read ({exc}).") from None
    finally:
        data.seek(start)


def _unpickle(stream: BinaryIO, where: str) -> Any:
    data: Any = _Bounded(stream, where)
    _prescan(data, where)
    try:
        return SafeUnpickler(data, where=where).load()
    except (UnsafePickleError, FormatError):
        raise
    except Exception as exc:  # a truncated or corrupt pickle: EOFError, UnpicklingError, RecursionError, ...
        raise FormatError(f"{where}: the pickle cannot be read ({type(exc).__name__}: {exc}).") from None


# -- reading -------------------------------------------------------------------------------------


def is_torch_file(path: Path, head: bytes | None = None) -> bool:
    """True when the file starts like a ``torch.save`` output (zip with ``data.pkl``, or legacy magic); ``head``:
    its first bytes when the caller has them."""
    head = read_head(path, 30 + 256) if head is None else head
    if head.startswith(LEGACY_MAGIC):
        return True
    if not head.startswith(ZIP_MAGIC) or len(head) < 30:
        return False
    # torch writes PREFIX/data.pkl first: its local header answers without parsing the central directory.
    name_length = struct.unpack("<H", head[26:28])[0]
    if head[30 : 30 + name_length].endswith(b"/data.pkl"):
        return True
    try:
        with zipfile.ZipFile(path) as archive:
            return any(n.endswith("/data.pkl") for n in archive.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


class _Record(NamedTuple):
    offset: int  # byte offset of the record's data in the file
    size: int


def _zip_records(path: Path) -> tuple[str, dict[str, _Record], bytes, str]:
    """The archive's prefix, its records' data offsets, ``data.pkl`` and the byte order."""
    try:
        return _parse_zip(path)
    except FormatError:
        raise
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        EOFError,
        OSError,
        ValueError,
        struct.error,
        RuntimeError,  # "File is encrypted" from a flipped flag bit
        NotImplementedError,  # "That compression method is not supported"
    ) as exc:
        # zipfile's own complaints about a damaged archive: bad CRC, names that do not match, bad offsets, ...
        raise FormatError(f"{path}: not a readable zip archive ({type(exc).__name__}: {exc}).") from None


def _parse_zip(path: Path) -> tuple[str, dict[str, _Record], bytes, str]:
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        if not infos:
            raise FormatError(f"{path}: the archive is empty.")
        prefix = infos[0].filename.split("/", 1)[0]
        names = {info.filename: info for info in infos}
        if f"{prefix}/constants.pkl" in names:
            raise FormatError(f"{path} is a TorchScript archive (it has constants.pkl), not a torch.save file.")
        for needed in ("data.pkl", "version"):
            if f"{prefix}/{needed}" not in names:
                raise FormatError(f"{path}: the archive has no {prefix}/{needed} record; torch.save always writes one.")
        records: dict[str, _Record] = {}
        handle = archive.fp  # the archive's own open file: no second open
        if handle is None:
            raise FormatError(f"{path}: the archive is closed.")
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        for info in infos:
            if info.compress_type != zipfile.ZIP_STORED:
                raise FormatError(
                    f"{path}: record {info.filename} is compressed (method {info.compress_type}); torch stores "
                    "records uncompressed and torch.load(mmap=True) would return garbage for it."
                )
            if info.compress_size != info.file_size:
                raise SizeMismatchError(
                    f"{path}: record {info.filename} says {info.file_size:,} bytes but stores {info.compress_size:,}; "
                    "torch stores records uncompressed, so the two are equal."
                )
            handle.seek(info.header_offset)
            local = handle.read(30)
            if len(local) < 30 or local[:4] != ZIP_MAGIC:
                raise FormatError(f"{path}: the local header of {info.filename} at byte {info.header_offset} is bad.")
            name_length, extra_length = struct.unpack("<HH", local[26:30])
            start = info.header_offset + 30 + name_length + extra_length
            if start + info.file_size > size:
                raise SizeMismatchError(f"{path}: record {info.filename} runs past the end of the file.")
            records[info.filename] = _Record(start, info.file_size)
        pickle_bytes = archive.read(f"{prefix}/data.pkl")
        order_name = f"{prefix}/byteorder"
        byteorder = (
            archive.read(order_name).decode("ascii", errors="replace").strip() if order_name in names else "little"
        )
    if byteorder not in ("little", "big"):
        raise HeaderError(f"{path}: the byteorder record says {byteorder!r}; expected 'little' or 'big'.")
    return prefix, records, pickle_bytes, byteorder


def _storage_array(path: Path, ref: _StorageRef, record: _Record, byteorder: str, element: np.dtype) -> np.ndarray:
    dtype = element.newbyteorder("<" if byteorder == "little" else ">") if element.itemsize > 1 else element
    numel_bytes = ref.numel if ref.storage_type.dtype is None else ref.numel * element.itemsize
    unit = "bytes" if ref.storage_type.dtype is None else "elements"
    if record.size != numel_bytes:
        raise SizeMismatchError(
            f"{path}: storage {ref.key} declares {ref.numel:,} {unit} ({numel_bytes:,} bytes) "
            f"but its record has {record.size:,} bytes."
        )
    if dtype == np.bool_:  # a mask: mapped as bytes, viewed as bool (a byte other than 0/1 is the caller's check)
        return map_file(path, np.dtype("u1"), record.offset, record.size).view(np.bool_)
    return map_file(path, dtype, record.offset, record.size // element.itemsize)


def _view(path: Path, tensor: TensorRef, storage: np.ndarray) -> np.ndarray:
    count = len(storage)
    if tensor.offset < 0 or any(s < 0 for s in tensor.size):
        raise FormatError(f"{path}: negative storage offset or size in {tensor}.")
    if 0 in tensor.size:
        return storage[0:0].reshape(tensor.size)
    numel = 1
    for n in tensor.size:
        numel *= n
    if numel > count:  # only an overlapping view (stride 0) shows more elements than its storage holds
        raise SizeMismatchError(
            f"{path}: the tensor claims {numel:,} elements (size {tensor.size}, stride {tensor.stride}) over a "
            f"storage of {count:,}; overlapping views are not token data."
        )
    last = tensor.offset + sum((n - 1) * s for n, s in zip(tensor.size, tensor.stride))
    if min(tensor.stride, default=0) < 0 or last >= count or tensor.offset >= count:
        raise SizeMismatchError(
            f"{path}: the tensor (offset {tensor.offset}, size {tensor.size}, stride {tensor.stride}) reaches "
            f"element {last:,} of storage {tensor.storage.key}, which has {count:,}."
        )
    if len(tensor.size) == 1 and tensor.stride == (1,):
        return storage[tensor.offset : tensor.offset + tensor.size[0]]
    strides = tuple(s * storage.itemsize for s in tensor.stride)
    base = storage[tensor.offset :]
    return np.lib.stride_tricks.as_strided(base, shape=tensor.size, strides=strides, writeable=False)


def _materialise(path: Path, value: Any, resolve: Any) -> Any:
    """Replace every TensorRef inside ``value`` (dicts, lists, tuples) by its NumPy array."""
    if isinstance(value, TensorRef):
        return _view(path, value, resolve(value))
    if isinstance(value, dict):
        return {k: _materialise(path, v, resolve) for k, v in value.items()}
    if type(value) in (list, tuple):  # not our stand-ins, which are NamedTuples
        return type(value)(_materialise(path, v, resolve) for v in value)
    return value


def _materialise_checked(path: Path, value: Any, resolve: Any) -> Any:
    try:
        return _materialise(path, value, resolve)
    except RecursionError:
        raise FormatError(f"{path}: the saved object nests containers too deeply to be token data.") from None


def load(path: str | os.PathLike[str]) -> Any:
    """Load a ``torch.save`` file as NumPy: tensors become read-only memory-mapped arrays.

    Only tensors, dicts, lists, tuples and plain values are admitted; any other global in the pickle
    raises :class:`~tokformats.UnsafePickleError` before it can run.
    """
    file = Path(path)
    if not file.is_file():
        raise NoFilesError(f"{file} does not exist.")
    with open(file, "rb") as handle:
        head = handle.read(len(LEGACY_MAGIC))
    if head.startswith(LEGACY_MAGIC):
        return _load_legacy(file)
    if not head.startswith(ZIP_MAGIC):
        raise FormatError(f"{file} is neither a torch zip archive nor a legacy torch file (it starts {head[:4]!r}).")
    _, records, pickle_bytes, byteorder = _zip_records(file)
    prefix = next(iter(records)).split("/", 1)[0]
    obj = _unpickle(io.BytesIO(pickle_bytes), f"{file}/data.pkl")
    cache: dict[tuple[str, np.dtype], np.ndarray] = {}

    def resolve(tensor: TensorRef) -> np.ndarray:
        key = tensor.storage.key
        if (key, tensor.dtype) not in cache:  # one untyped storage may be viewed as several dtypes
            name = f"{prefix}/data/{key}"
            if name not in records:
                raise FormatError(f"{file}: data.pkl refers to storage {key!r}, but the archive has no {name} record.")
            cache[(key, tensor.dtype)] = _storage_array(file, tensor.storage, records[name], byteorder, tensor.dtype)
        return cache[(key, tensor.dtype)]

    return _materialise_checked(file, obj, resolve)


def _load_legacy(path: Path) -> Any:
    with open(path, "rb") as handle:
        where = str(path)
        magic = _unpickle(handle, where)
        if magic != LEGACY_MAGIC_NUMBER:
            raise HeaderError(f"{path}: legacy magic number is {magic!r}.")
        protocol = _unpickle(handle, where)
        if protocol != LEGACY_PROTOCOL:
            raise HeaderError(f"{path}: legacy protocol version is {protocol!r}; torch wrote {LEGACY_PROTOCOL}.")
        sys_info = _unpickle(handle, where)
        little = not isinstance(sys_info, dict) or sys_info.get("little_endian", True)
        obj = _unpickle(handle, where)
        keys = _unpickle(handle, where)
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise FormatError(f"{path}: the legacy storage key list is malformed ({keys!r}).")
        position = handle.tell()
    size = path.stat().st_size
    refs: dict[str, _StorageRef] = {}

    def collect(value: Any) -> None:
        if isinstance(value, TensorRef):
            refs[value.storage.key] = value.storage
        elif isinstance(value, dict):
            for v in value.values():
                collect(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                collect(v)

    collect(obj)
    records: dict[str, _Record] = {}
    element_sizes = {
        k: (r.storage_type.dtype.itemsize if r.storage_type.dtype is not None else 1) for k, r in refs.items()
    }
    with open(path, "rb") as handle:
        for key in keys:
            handle.seek(position)
            count_bytes = handle.read(8)
            if len(count_bytes) < 8:
                raise SizeMismatchError(f"{path}: the file ends before storage {key}.")
            count = struct.unpack("<q" if little else ">q", count_bytes)[0]
            length = count * element_sizes.get(key, 1)
            if count < 0 or position + 8 + length > size:
                raise SizeMismatchError(f"{path}: storage {key} declares {count:,} elements, past the end of the file.")
            records[key] = _Record(position + 8, length)
            position += 8 + length
    order = "little" if little else "big"

    def resolve(tensor: TensorRef) -> np.ndarray:
        key = tensor.storage.key
        if key not in records:
            raise FormatError(f"{path}: the object refers to storage {key!r}, which the file does not hold.")
        return _storage_array(path, tensor.storage, records[key], order, tensor.dtype)

    return _materialise_checked(path, obj, resolve)


# -- writing -------------------------------------------------------------------------------------

#: dtype -> (rebuild function, storage global, numel in bytes?, torch dtype name for v3)
_WRITE_TYPES: dict[str, tuple[str, tuple[str, str], bool]] = {
    "int64": ("_rebuild_tensor_v2", ("torch", "LongStorage"), False),
    "int32": ("_rebuild_tensor_v2", ("torch", "IntStorage"), False),
    "int16": ("_rebuild_tensor_v2", ("torch", "ShortStorage"), False),
    "int8": ("_rebuild_tensor_v2", ("torch", "CharStorage"), False),
    "uint8": ("_rebuild_tensor_v2", ("torch", "ByteStorage"), False),
    "bool": ("_rebuild_tensor_v2", ("torch", "BoolStorage"), False),
    "float16": ("_rebuild_tensor_v2", ("torch", "HalfStorage"), False),
    "float32": ("_rebuild_tensor_v2", ("torch", "FloatStorage"), False),
    "float64": ("_rebuild_tensor_v2", ("torch", "DoubleStorage"), False),
    "uint16": ("_rebuild_tensor_v3", ("torch.storage", "UntypedStorage"), True),
    "uint32": ("_rebuild_tensor_v3", ("torch.storage", "UntypedStorage"), True),
    "uint64": ("_rebuild_tensor_v3", ("torch.storage", "UntypedStorage"), True),
}


class _Pickler:
    """Emits protocol-2 opcodes exactly as CPython's pickler would for torch's tensor reduction."""

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x02")
        self._memo: dict[Any, int] = {}

    def _put(self, key: Any) -> None:
        index = len(self._memo)
        self._memo[key] = index
        self.out += b"q" + bytes([index]) if index < 256 else b"r" + struct.pack("<I", index)

    def _get(self, key: Any) -> bool:
        index = self._memo.get(key)
        if index is None:
            return False
        self.out += b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)
        return True

    def global_(self, module: str, name: str) -> None:
        if not self._get(("global", module, name)):
            self.out += b"c" + f"{module}\n{name}\n".encode("ascii")
            self._put(("global", module, name))

    def text(self, value: str) -> None:
        if not self._get(("text", value)):
            data = value.encode("utf-8")
            self.out += b"X" + struct.pack("<I", len(data)) + data
            self._put(("text", value))

    def integer(self, value: int) -> None:
        if 0 <= value <= 0xFF:
            self.out += b"K" + bytes([value])
        elif 0 <= value <= 0xFFFF:
            self.out += b"M" + struct.pack("<H", value)
        elif -(2**31) <= value < 2**31:
            self.out += b"J" + struct.pack("<i", value)
        else:
            data = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            self.out += b"\x8a" + bytes([len(data)]) + data

    def memo_tuple(self, count: int) -> None:
        """Close a tuple of ``count`` items already emitted (after a MARK for count > 3) and memoise it."""
        self.out += {1: b"\x85", 2: b"\x86", 3: b"\x87"}.get(count, b"t")
        self._put(("tuple", len(self.out)))


def tensor_pickle(dtype: np.dtype, numel: int, key: str = "0") -> bytes:
    """``data.pkl`` for a contiguous 1-D tensor of ``numel`` elements in storage ``key``, as torch writes it."""
    rebuild, storage, untyped = _WRITE_TYPES[dtype.name]
    p = _Pickler()
    p.global_("torch._utils", rebuild)
    p.out += b"(("  # MARK (arguments), MARK (persistent id)
    p.text("storage")
    p.global_(*storage)
    p.text(key)
    p.text("cpu")
    p.integer(numel * dtype.itemsize if untyped else numel)
    p.memo_tuple(5)
    p.out += b"Q"  # BINPERSID
    p.integer(0)  # storage offset
    p.integer(numel)
    p.memo_tuple(1)  # size
    p.integer(1)
    p.memo_tuple(1)  # stride
    p.out += b"\x89"  # requires_grad False
    p.global_("collections", "OrderedDict")
    p.out += b")R"  # OrderedDict()
    p._put(("hooks", len(p.out)))
    if untyped:
        p.global_("torch", dtype.name)
    p.memo_tuple(7 if untyped else 6)
    p.out += b"R"
    p._put(("tensor", len(p.out)))
    p.out += b"."
    return bytes(p.out)


#: Entries at or above this size or offset need zip64 fields (a module constant so tests can lower it).
ZIP64_LIMIT = 0xFFFFFFFF
#: What a 32-bit field holds when the real value lives in a zip64 field.
_ZIP64_SENTINEL = 0xFFFFFFFF


def _field(value: int) -> int:
    return value if value < ZIP64_LIMIT else _ZIP64_SENTINEL


class _ZipWriter:
    """Writes a stored-only zip the way PyTorch's (miniz-based) writer does."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.entries: list[tuple[bytes, int, int, int]] = []  # name, crc, size, header offset

    def add(self, name: str, chunks: list[memoryview] | bytes) -> int:
        """Append one stored record; returns its CRC-32."""
        parts = [memoryview(chunks)] if isinstance(chunks, bytes) else chunks
        size = sum(p.nbytes for p in parts)
        offset = self.handle.tell()
        encoded = name.encode("utf-8")
        large = size >= ZIP64_LIMIT or offset >= ZIP64_LIMIT
        zip64 = b""
        if large:
            # miniz writes a zip64 field in the local header holding (size, size) and/or the offset.
            body = b""
            if size >= ZIP64_LIMIT:
                body += struct.pack("<QQ", size, size)
            if offset >= ZIP64_LIMIT:
                body += struct.pack("<Q", offset)
            zip64 = struct.pack("<HH", 1, len(body)) + body
        start = offset + 30 + len(encoded) + len(zip64) + 4
        padding = (-start) % ALIGNMENT
        extra = zip64 + b"FB" + struct.pack("<H", padding) + b"Z" * padding
        # miniz writes a data descriptor (flag bit 3) after every non-empty record, none after an empty one.
        flags = 0x0808 if size else 0x0800
        self.handle.write(struct.pack("<4sHHHHHIIIHH", ZIP_MAGIC, 0, flags, 0, 0, 0, 0, 0, 0, len(encoded), len(extra)))
        self.handle.write(encoded + extra)
        crc = 0
        for part in parts:
            self.handle.write(part)
            crc = zlib.crc32(part, crc)
        if size >= ZIP64_LIMIT:
            self.handle.write(struct.pack("<4sIQQ", b"PK\x07\x08", crc, size, size))
        elif size:
            self.handle.write(struct.pack("<4sIII", b"PK\x07\x08", crc, size, size))
        self.entries.append((encoded, crc, size, offset))
        return crc

    def finish(self) -> None:
        directory_offset = self.handle.tell()
        for encoded, crc, size, offset in self.entries:
            body = b""
            if size >= ZIP64_LIMIT:
                body += struct.pack("<QQ", size, size)
            if offset >= ZIP64_LIMIT:
                body += struct.pack("<Q", offset)
            extra = struct.pack("<HH", 1, len(body)) + body if body else b""
            small = _field(size)
            self.handle.write(
                struct.pack(
                    "<4sHHHHHHIIIHHHHHII",
                    b"PK\x01\x02",
                    0,
                    0,
                    0x0808 if size else 0x0800,
                    0,
                    0,
                    0,
                    crc,
                    small,
                    small,
                    len(encoded),
                    len(extra),
                    0,
                    0,
                    0,
                    0,
                    _field(offset),
                )
            )
            self.handle.write(encoded + extra)
        end = self.handle.tell()
        count, directory_size = len(self.entries), end - directory_offset
        self.handle.write(
            struct.pack(
                "<4sQHHIIQQQQ", b"PK\x06\x06", 44, 0x031E, 0x2D, 0, 0, count, count, directory_size, directory_offset
            )
        )
        self.handle.write(struct.pack("<4sIQI", b"PK\x06\x07", 0, end, 1))
        self.handle.write(
            struct.pack(
                "<4sHHHHIIH",
                b"PK\x05\x06",
                0,
                0,
                count,
                count,
                _field(directory_size),
                _field(directory_offset),
                0,
            )
        )


def serialization_id(*parts: bytes) -> str:
    """A 40-digit decimal id for ``.data/serialization_id``.

    torch draws a random one; tokformats derives it from the archive's content so that the same tokens
    always give the same bytes (resumed runs are byte-identical to uninterrupted ones), while different
    content still gets a different id.
    """
    import hashlib  # here, not at import time: hashlib's OpenSSL binding costs milliseconds to load

    digest = hashlib.sha256(b"".join(parts)).digest()
    return f"{int.from_bytes(digest[:16], 'big'):040d}"[-40:]


def write_tensor(handle: BinaryIO, array: np.ndarray, *, prefix: str = "archive", record_id: str | None = None) -> None:
    """Write ``array`` (1-D) into ``handle`` as ``torch.save`` would; the caller owns atomicity."""
    dtype = np.dtype(array.dtype)
    if dtype.name not in _WRITE_TYPES:
        raise DTypeError(f"torch has no tensor dtype for {dtype.name}.")
    if dtype.itemsize > 1:
        array = array.astype(dtype.newbyteorder("<"), copy=False)
    data = np.ascontiguousarray(array).reshape(-1)
    if not prefix.isascii() or "/" in prefix or not prefix:
        raise ValueError(f"the archive prefix must be a non-empty ASCII name without '/', not {prefix!r}")
    zipper = _ZipWriter(handle)
    step = 1 << 26  # CRC and write in 64 MiB pieces, never copying the whole array
    view = memoryview(data.view(np.uint8).data)
    pickled = tensor_pickle(dtype.newbyteorder("=") if dtype.itemsize > 1 else dtype, len(data))
    zipper.add(f"{prefix}/data.pkl", pickled)
    zipper.add(f"{prefix}/.format_version", b"1")
    zipper.add(f"{prefix}/.storage_alignment", b"64")
    zipper.add(f"{prefix}/byteorder", b"little")
    crc = zipper.add(f"{prefix}/data/0", [view[i : i + step] for i in range(0, len(view), step)] or [memoryview(b"")])
    zipper.add(f"{prefix}/version", b"3\n")
    if record_id is None:
        record_id = serialization_id(prefix.encode(), pickled, struct.pack("<IQ", crc, len(view)))
    zipper.add(f"{prefix}/.data/serialization_id", record_id.encode("ascii"))
    zipper.finish()


def save(array: Any, path: str | os.PathLike[str], *, prefix: str | None = None, overwrite: bool = False) -> Path:
    """Write a 1-D array to ``path`` as ``torch.save(torch.from_numpy(array))`` would (without torch).

    The archive prefix defaults to the file's stem (as torch names it), or ``archive`` for non-ASCII stems. An
    existing file is replaced only with ``overwrite=True``.
    """
    from ..fs.atomic import AtomicFiles

    target = Path(path)
    data = np.asarray(array)
    if data.ndim != 1:
        raise FormatError(f"save writes 1-D token arrays; found shape {data.shape}.")
    stem = prefix or target.stem
    name = stem if stem.isascii() and stem and "/" not in stem else "archive"
    with AtomicFiles(overwrite=overwrite) as files:
        write_tensor(files.create(target), data, prefix=name)
    return target
