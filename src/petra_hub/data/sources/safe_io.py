"""Reading data files that may come from someone else: no code runs, memory stays bounded.

``read_capped(path, max_bytes)``   the whole file, its size checked before reading.
``read_tar_members(path, caps, max_total_bytes)``
                                   wanted members of a (compressed) tar archive, read in
                                   place (never extracted to disk): regular files only
                                   (no links), each member's declared size checked
                                   against its cap before reading, at most
                                   ``MAX_TAR_MEMBERS`` members and ``max_total_bytes``
                                   of content scanned, the scan stopping once every
                                   wanted member is found.  Header data is capped
                                   before tarfile reads it (tarfile reads a GNU long
                                   name / long link or a pax header whole, whatever
                                   size it claims): each read of it at most
                                   ``MAX_TAR_HEADER_RECORD`` bytes, at most
                                   ``MAX_TAR_HEADER_READS`` reads ahead of one member
                                   (chained records, sparse maps) and
                                   ``MAX_TAR_HEADER_BYTES`` in all.  So no more of the
                                   stream is ever decompressed than the caps allow.
``load_npz(path, max_bytes)``      the arrays of an ``.npz``, each member read with
                                   numpy's ``.npy`` reader and ``allow_pickle=False``
                                   (what ``np.load`` does); the file size, the members'
                                   declared sizes and each ``.npy`` header (shape x item
                                   size) are checked before any array is allocated
                                   (numpy allocates what a header claims).  ``only``
                                   names the members to read (the others' headers are
                                   still checked).
``NpzRows(path, name)``            one member of an ``.npz`` read a row at a time, when
                                   asked, seeking within the member: what a process that
                                   needs a few images of a large file reads of it.
``unpickle(raw, where)``           a pickled dict through a restricted unpickler: the
                                   only globals are those numpy arrays pickle with
                                   (``_reconstruct`` of an *empty* array, ``ndarray``
                                   only as its argument, ``dtype`` of booleans, integers
                                   and floats, ``scalar``, ``_frombuffer``),
                                   ``_codecs.encode`` with Latin-1 (how Python 3 pickles
                                   bytes at protocol 2) and ``copyreg._reconstructor`` /
                                   ``object`` for plain objects.  No global can allocate
                                   more than the pickle holds: an array's state is
                                   checked (bytes = shape x item size) and viewed with
                                   ``np.frombuffer``, never passed to numpy's
                                   ``__setstate__``.  No numpy object the pickle can
                                   reach is ever numpy's own: a dtype is a description
                                   (its state checked as plain), made into a fresh
                                   dtype where an array or scalar is built, because
                                   numpy's ``dtype.__setstate__`` sets whatever flags a
                                   pickle names (object included: a crash, or a pointer
                                   read from the file).

Errors are ``ValueError`` naming the file and what was expected.
"""

from __future__ import annotations

import contextlib
import copyreg
import io
import math
import os
import pickle
import struct
import tarfile
import warnings
import zipfile
import zlib

import numpy as np

__all__ = ["MAX_TAR_MEMBERS", "MAX_TAR_HEADER_RECORD", "MAX_TAR_HEADER_READS", "MAX_TAR_HEADER_BYTES",
           "read_capped", "read_tar_members", "load_npz", "NpzRows", "unpickle"]

# A CIFAR archive holds 5 to 9 entries; anything with more is not one.
MAX_TAR_MEMBERS = 1_000
# Header data of an archive (tarfile reads each record whole, before any cap here could look at it).  One
# record: a GNU long name or long link, a pax header (POSIX paths are at most 4 KiB).
MAX_TAR_HEADER_RECORD = 64 * 1024
# Reads ahead of one member: its header, its records and their headers (pax global + pax + long name + long
# link take 10), or a sparse map's blocks.  tarfile recurses once per record: this also bounds its depth.
MAX_TAR_HEADER_READS = 16
# All header data of the archive: 1,000 members with a pax header each take 1 MB.
MAX_TAR_HEADER_BYTES = 4 * 2**20


class _Refused(ValueError):
    """A file refused by a check here (re-raised as is, not as "unreadable")."""


def _too_big(where: str, size: int, limit: int, what: str) -> ValueError:
    return _Refused(f"{where}: {size:,} bytes, more than {what} can be (at most {limit:,} bytes); "
                    "refusing to read it")


def read_capped(path: str, max_bytes: int, what: str = "this file") -> bytes:
    """The bytes of ``path``; ValueError before reading when it holds more than ``max_bytes``."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > max_bytes:
            raise _too_big(path, size, max_bytes, what)
        raw = fh.read(size + 1)  # not max_bytes + 1: read(n) reserves n bytes first
    if len(raw) > max_bytes:
        raise _too_big(path, len(raw), max_bytes, what)
    return raw


class _HeaderRefused(_Refused):
    """Header data over a cap (re-raised by :func:`read_tar_members` with the archive's path)."""


class _HeaderReads:
    """The (decompressed) stream tarfile reads, refusing header reads over the caps.

    ``guarded`` is set while ``TarFile.next()`` runs: everything it reads then is header
    data (member data is read through ``extractfile``, or skipped with ``seek``).  Each
    read is checked before the stream is asked for it."""

    def __init__(self, fileobj):
        self._fileobj = fileobj
        self.guarded = False
        self.reads = 0  # in this next()
        self.total = 0  # in the whole archive

    def __getattr__(self, name):  # seek, tell, close, name, ...
        return getattr(self._fileobj, name)

    def read(self, size=-1):
        if self.guarded:
            if size is None or size < 0 or size > MAX_TAR_HEADER_RECORD:
                claimed = "unbounded size" if size is None or size < 0 else f"{size:,} bytes"
                raise _HeaderRefused(f"a header record (long name, long link or pax header) of {claimed}, more "
                                     f"than one can be (at most {MAX_TAR_HEADER_RECORD:,} bytes); refusing to read it")
            self.reads += 1
            self.total += size
            if self.reads > MAX_TAR_HEADER_READS:
                raise _HeaderRefused(f"more than {MAX_TAR_HEADER_READS} header reads ahead of one member "
                                     "(chained long names / pax headers, or a long sparse map); "
                                     "not a data set archive")
            if self.total > MAX_TAR_HEADER_BYTES:
                raise _HeaderRefused(f"header records add up to more than {MAX_TAR_HEADER_BYTES:,} bytes "
                                     "(long names, pax headers); not a data set archive")
        return self._fileobj.read(size)


class _CappedTarFile(tarfile.TarFile):
    """A TarFile whose header reads go through :class:`_HeaderReads` (the first one too:
    ``TarFile.__init__`` reads the first member with ``self.next()``)."""

    def next(self):
        guard = self.fileobj
        if not isinstance(guard, _HeaderReads):
            guard = self.fileobj = _HeaderReads(self.fileobj)
        guard.guarded, guard.reads = True, 0
        try:
            return super().next()
        finally:
            guard.guarded = False


def read_tar_members(tar_path: str, caps: dict[str, tuple[int, str]],
                     max_total_bytes: int) -> dict[str, bytes]:
    """Bytes of the regular-file members whose base name is a key of ``caps`` (the first of
    each); ``caps[name]`` is (the most bytes it may hold, what it is, for the error).
    Missing names are simply absent."""
    out: dict[str, bytes] = {}
    try:
        with _CappedTarFile.open(tar_path, "r:*") as tar:
            count = total = 0
            while len(out) < len(caps):
                member = tar.next()
                if member is None:
                    break
                count += 1
                total += max(int(member.size), 0)
                if count > MAX_TAR_MEMBERS:
                    raise ValueError(f"{tar_path}: more than {MAX_TAR_MEMBERS:,} archive members; "
                                     "not a data set archive")
                if total > max_total_bytes:
                    raise ValueError(f"{tar_path}: members add up to more than {max_total_bytes:,} "
                                     "bytes, more than a genuine archive holds; refusing to read on")
                base = os.path.basename(member.name)
                if not member.isfile() or base not in caps or base in out:
                    continue
                where = f"{tar_path}: member {member.name}"
                if member.size > caps[base][0]:
                    raise _too_big(where, member.size, *caps[base])
                out[base] = tar.extractfile(member).read()  # member.size bytes at most
    except _HeaderRefused as exc:
        raise _Refused(f"{tar_path}: {exc}") from None
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"{tar_path}: unreadable archive ({exc})") from None
    return out


def _npy_header(fh, where: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, Fortran order, dtype) from the header of an ``.npy`` stream, which is left at the first data byte."""
    fmt = np.lib.format
    version = fmt.read_magic(fh)
    read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
    shape, fortran_order, dtype = read_header(fh)
    if dtype.hasobject:
        raise _Refused(f"{where}: object arrays are not allowed")
    return tuple(int(s) for s in shape), fortran_order, dtype


def _member_header(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: str) -> tuple:
    """(shape, Fortran order, dtype, offset of the first data byte within the member) of an ``.npz`` member, from its
    header alone; refused when the header claims more data than the member holds (numpy would allocate it all, then
    fail)."""
    with zf.open(info) as fh:
        shape, fortran_order, dtype = _npy_header(fh, f"{path}: {info.filename}")
        offset = fh.tell()
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > info.file_size:
        raise _Refused(f"{path}: the header of {info.filename} claims {nbytes:,} bytes of data, the member holds "
                       f"{info.file_size:,}")
    return shape, fortran_order, dtype, offset


def load_npz(path: str, max_bytes: int, what: str = "this file",
             only: frozenset[str] | None = None) -> dict[str, np.ndarray]:
    """The ``.npy`` arrays of the ``.npz`` at ``path`` (other members are ignored; with ``only``, those not named
    there too), read with ``allow_pickle=False``; ValueError before allocating them when the file or its
    members add up to more than ``max_bytes``, or a ``.npy`` header claims more data than
    its member holds."""
    size = os.path.getsize(path)
    if size > max_bytes:
        raise _too_big(path, size, max_bytes, what)
    with _npz_errors(path), zipfile.ZipFile(path) as zf:
        members = [i for i in zf.infolist() if i.filename.endswith(".npy")]
        declared = sum(i.file_size for i in members)
        if declared > max_bytes:
            raise _too_big(f"{path} (uncompressed)", declared, max_bytes, what)
        for info in members:
            _member_header(zf, info, path)
        out = {}
        for info in members:
            if only is not None and info.filename[: -len(".npy")] not in only:
                continue
            with zf.open(info) as fh:
                out[info.filename[: -len(".npy")]] = np.lib.format.read_array(
                    fh, allow_pickle=False)
        return out


class NpzRows:
    """Member ``name`` of the ``.npz`` at ``path``, read a row (an index of its first axis) at a time when asked, so
    that a few rows of a large array cost a few small reads: a stored member (``np.savez``) is read at the row's
    offset in the file, a compressed one (``np.savez_compressed``) decompressed up to the row in pieces of
    ``SKIP_PIECE`` bytes. ``shape`` and ``dtype`` come from the member's header, checked as :func:`load_npz` checks
    it (no object arrays; no more data than the member holds); a Fortran-ordered member, whose rows are not
    contiguous, is refused."""

    SKIP_PIECE = 1 << 20

    def __init__(self, path: str, name: str):
        self.path, self.member = path, name + ".npy"
        where = f"{path}: {self.member}"
        with _npz_errors(path), zipfile.ZipFile(path) as zf:
            if self.member not in zf.namelist():
                raise _Refused(f"{path}: no member {self.member} (members: {', '.join(zf.namelist())})")
            info = zf.getinfo(self.member)
            self.shape, fortran_order, self.dtype, self._first_row = _member_header(zf, info, path)
            stored = info.compress_type == zipfile.ZIP_STORED
            self._file_offset = _stored_data_offset(zf.fp, info) + self._first_row if stored else None
        if fortran_order:
            raise _Refused(f"{where}: a Fortran-ordered array cannot be read a row at a time; save it in C order")
        if not self.shape:
            raise _Refused(f"{where}: a scalar has no rows")
        self.ndim = len(self.shape)
        self.row_bytes = math.prod(self.shape[1:]) * self.dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: int) -> np.ndarray:
        if not 0 <= index < self.shape[0]:
            raise IndexError(f"row {index} of {self.path}: {self.member}, which has {self.shape[0]}")
        with _npz_errors(self.path):
            if self._file_offset is not None:
                with open(self.path, "rb") as fh:
                    fh.seek(self._file_offset + index * self.row_bytes)
                    raw = fh.read(self.row_bytes)
            else:
                with zipfile.ZipFile(self.path) as zf, zf.open(self.member) as fh:
                    to_skip = self._first_row + index * self.row_bytes
                    while to_skip > 0:
                        skipped = len(fh.read(min(to_skip, self.SKIP_PIECE)))
                        if not skipped:
                            break
                        to_skip -= skipped
                    raw = fh.read(self.row_bytes)
        if len(raw) != self.row_bytes:
            raise ValueError(f"{self.path}: {self.member} ends before row {index}")
        return np.frombuffer(raw, self.dtype).reshape(self.shape[1:])


def _stored_data_offset(archive, info: zipfile.ZipInfo) -> int:
    """Where a stored (uncompressed) member's bytes begin in the archive: after its local header, whose name and
    extra field may differ in length from the central directory's."""
    archive.seek(info.header_offset)
    header = archive.read(_LOCAL_HEADER_BYTES)
    if len(header) != _LOCAL_HEADER_BYTES or header[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"no local header for {info.filename}")
    name_length, extra_length = struct.unpack("<HH", header[26:30])  # the header's last two fields
    return info.header_offset + _LOCAL_HEADER_BYTES + name_length + extra_length


_LOCAL_HEADER_BYTES = 30  # a zip member's local header before its name and extra field (APPNOTE 4.3.7)


@contextlib.contextmanager
def _npz_errors(path: str):
    """Re-raise what reading an ``.npz`` raises as a ValueError naming the file (refusals pass as they are)."""
    try:
        yield
    except (_Refused, IndexError):
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"{path}: unreadable .npz ({type(exc).__name__}: {exc})") from None


class _NdarrayName:
    """Stands for ``numpy.ndarray`` in a pickle: only ``_reconstruct`` may use it (calling
    ``ndarray(shape)`` itself would allocate whatever shape the pickle names)."""

    def __new__(cls, *args, **kwargs):
        raise pickle.UnpicklingError("numpy.ndarray may only be used to rebuild a pickled array")


class _PickledDtype:
    """``numpy.dtype(code, align, copy)`` in a pickle: the description of a plain dtype, not a
    numpy dtype.  numpy's ``dtype.__setstate__`` (the pickle's BUILD) sets any flags, byte
    order or item size the state names on a dtype it has made, the object flag included; so
    the pickle only ever reaches this description, whose ``__setstate__`` accepts numpy's
    state of a plain type and nothing else, and :meth:`make` builds a fresh dtype from it
    each time an array or scalar needs one (a later BUILD cannot change one in use)."""

    __slots__ = ("code", "byteorder")

    def __init__(self, code, align=False, copy=False):
        if isinstance(code, bytes):
            code = code.decode("latin1")
        if not isinstance(code, str) or _plain(np.dtype(code)) is None:
            raise pickle.UnpicklingError(f"only boolean, integer and float dtypes are allowed, got {code!r}")
        self.code, self.byteorder = code, None

    def __setstate__(self, state):
        # numpy's state of a plain type: (version, byte order, subarray, names, fields, item size, alignment,
        # flags[, metadata]), with -1 for the sizes of a built-in type and no flags
        if not isinstance(state, tuple) or len(state) not in (8, 9) or state[0] not in (3, 4) \
                or state[1] not in ("<", ">", "|", "=") or state[2:5] != (None, None, None) \
                or state[5:8] != (-1, -1, 0) or (len(state) == 9 and state[8] is not None):
            raise pickle.UnpicklingError(f"not the state of a plain dtype: {state!r}")
        self.byteorder = state[1]

    def make(self) -> np.dtype:
        dtype = np.dtype(self.code)
        if self.byteorder in ("<", ">"):
            dtype = dtype.newbyteorder(self.byteorder)
        return dtype


def _plain(dtype: np.dtype) -> np.dtype | None:
    """``dtype`` if it is a boolean, integer or float type (what data files hold), else None."""
    return dtype if dtype.kind in "biuf" and not dtype.hasobject and dtype.fields is None else None


def _made(dtype) -> np.dtype:
    """The fresh numpy dtype of a pickled dtype description."""
    if not isinstance(dtype, _PickledDtype):
        raise pickle.UnpicklingError(f"expected a pickled numpy dtype, got {type(dtype).__name__}")
    return dtype.make()


class _PickledArray:
    """What ``_reconstruct`` and ``_frombuffer`` give: its ``__setstate__`` checks numpy's
    array state (shape, dtype, Fortran order, raw bytes) and views the bytes with
    ``np.frombuffer``.  numpy's own ``ndarray.__setstate__`` is never run: it allocates
    whatever shape the state names and, for an object dtype, reads past a short list (a
    crash).  :func:`unpickle` replaces each top-level one by its ``array`` (read-only,
    backed by the pickled bytes)."""

    __slots__ = ("array",)

    def __setstate__(self, state):
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise pickle.UnpicklingError("not a numpy array state")
        shape, dtype, fortran, raw = state[-4:]
        self.array = _array(raw, _made(dtype), shape, "F" if fortran else "C")


def _array(raw, dtype: np.dtype, shape, order: str) -> np.ndarray:
    """``raw`` viewed as an array of `shape` and `dtype`, if it holds exactly that many bytes."""
    if not isinstance(shape, tuple) or not all(type(s) is int and s >= 0 for s in shape):
        raise pickle.UnpicklingError(f"bad array shape {shape!r}")
    if isinstance(raw, str):  # Python-2 pickles: bytes read as Latin-1 text
        raw = raw.encode("latin1")
    if not isinstance(raw, (bytes, bytearray)):
        raise pickle.UnpicklingError(f"array data must be bytes, got {type(raw).__name__}")
    if len(raw) != math.prod(shape) * dtype.itemsize:
        raise pickle.UnpicklingError(f"array data of {len(raw):,} bytes does not match shape {shape} of {dtype}")
    flat = np.frombuffer(raw, dtype=dtype) if raw else np.zeros(0, dtype)
    return flat.reshape(shape, order=order)


def _from_buffer(raw, dtype, shape, order="C"):
    """numpy's ``_frombuffer`` (protocol 5): a checked view of the pickled bytes, wrapped as a
    ``_PickledArray`` so that a BUILD on it reaches the checked ``__setstate__``, never numpy's."""
    if order not in ("C", "F"):
        raise pickle.UnpicklingError(f"bad array order {order!r}")
    array = _PickledArray()
    array.array = _array(raw, _made(dtype), shape, order)
    return array


def _scalar(dtype, raw=b""):
    """numpy's ``scalar``: a plain dtype's value from exactly its bytes, as a Python number."""
    dtype = _made(dtype)
    if isinstance(raw, str):
        raw = raw.encode("latin1")
    if not isinstance(raw, bytes) or len(raw) != dtype.itemsize:
        raise pickle.UnpicklingError(f"a {dtype} scalar needs {dtype.itemsize} bytes")
    return np.frombuffer(raw, dtype=dtype)[0].item()


def _reconstruct(subtype, shape, dtype):
    """numpy's ``_reconstruct``: the empty placeholder numpy pickles before the data."""
    if subtype is not _NdarrayName:
        raise pickle.UnpicklingError("_reconstruct may only rebuild a numpy.ndarray")
    if not isinstance(shape, tuple) or not all(type(s) is int and s >= 0 for s in shape) \
            or math.prod(shape) != 0:
        raise pickle.UnpicklingError(f"_reconstruct of a non-empty shape {shape!r} is not allowed "
                                     "(numpy pickles an empty placeholder, then the data)")
    return _PickledArray()


def _encode(text, encoding="utf-8", errors="strict"):
    """``_codecs.encode`` as Python 3 pickles bytes at protocol 2: Latin-1 only."""
    if not isinstance(text, str) or str(encoding).lower().replace("-", "").replace("_", "") \
            not in ("latin1", "iso88591"):
        raise pickle.UnpicklingError("_codecs.encode is allowed for Latin-1 text only")
    return text.encode("latin1")


def _reconstructor(cls, base, state):
    """``copyreg._reconstructor`` for plain objects only (``base.__new__`` could allocate)."""
    if base is not object:
        raise pickle.UnpicklingError("copyreg._reconstructor is allowed for plain objects only")
    return copyreg._reconstructor(cls, base, state)


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickles dicts / lists / numpy arrays only (the CIFAR and ImageNet32 files)."""

    @staticmethod
    def _allowed():
        return {
            ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
            ("numpy._core.multiarray", "scalar"): _scalar,
            ("numpy._core.numeric", "_frombuffer"): _from_buffer,
            ("numpy", "ndarray"): _NdarrayName,
            ("numpy", "dtype"): _PickledDtype,
            ("_codecs", "encode"): _encode,
            ("copyreg", "_reconstructor"): _reconstructor,
            ("builtins", "object"): object,
        }

    def find_class(self, module: str, name: str):
        module = {"copy_reg": "copyreg", "__builtin__": "builtins"}.get(module, module)
        if module.startswith("numpy.core"):  # files written with numpy < 2
            module = "numpy._core" + module[len("numpy.core"):]
        try:
            return self._allowed()[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed") from None


def unpickle(raw: bytes, where: str, holding: str = "'data' and labels") -> dict:
    """The dict pickled in ``raw`` (bytes keys decoded); ValueError naming ``where`` (and what the dict should be
    ``holding``) if not."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj = _RestrictedUnpickler(io.BytesIO(raw), encoding="latin1").load()
    except Exception as exc:  # noqa: BLE001 - any failure means a bad file
        raise ValueError(f"{where}: not a readable pickle of a dict with {holding} "
                         f"({type(exc).__name__}: {exc})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a pickled dict, got {type(obj).__name__}")
    out = {}
    for k, v in obj.items():
        if isinstance(v, _PickledArray):
            if not hasattr(v, "array"):
                raise ValueError(f"{where}: not a readable pickle: array {k!r} without its data")
            v = v.array
        out[k.decode("latin1") if isinstance(k, bytes) else k] = v
    return out
