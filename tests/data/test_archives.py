"""Tarballs that claim huge header records (GNU long names / links, pax headers, sparse maps) are refused
before tarfile reads those records: a few hundred KB of gzip must not make us allocate hundreds of MB.

Each archive here is crafted block by block (tarfile would not write such headers), gzip-compressed."""

from __future__ import annotations

import gzip
import re
import tarfile
import tracemalloc

import numpy as np
import pytest

from petra_hub.data import load_image_dataset
from petra_hub.data.sources import safe_io
from petra_hub.data.sources.safe_io import read_tar_members
from petra_hub.testing.data_files import tar_folder as _tar
from petra_hub.testing.data_files import write_cifar10 as _write_cifar10

BIG = 16 * 2**20  # what a crafted record claims; far above the cap, small enough to test the old code with
CAPS = {"test_batch": (2**20, "a test batch"), "batches.meta": (2**16, "a meta file")}


def _header(name: str, size: int, typeflag: bytes, patch: dict[int, int] | None = None) -> bytes:
    """One 512-byte header block (checksum fixed after ``patch``: {offset: byte})."""
    info = tarfile.TarInfo(name)
    info.size, info.type = size, typeflag
    buf = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    assert len(buf) == tarfile.BLOCKSIZE
    for pos, value in (patch or {}).items():
        buf[pos] = value
    buf[148:156] = b" " * 8
    buf[148:155] = b"%06o\0" % sum(buf)
    return bytes(buf)


def _pad(n: int) -> bytes:
    return b"\0" * (-n % tarfile.BLOCKSIZE)


def _pax_record(length: int) -> bytes:
    """One pax record ``"<length> c=aaa...\\n"`` of exactly ``length`` bytes."""
    body = length - len(str(length)) - len(" c=\n")
    return b"%d c=%s\n" % (length, b"a" * body)


def _write_bomb(path, typeflag: bytes, size: int = BIG) -> None:
    """A gzip tarball: one ``typeflag`` record claiming ``size`` bytes (and holding them), then a member."""
    with gzip.open(path, "wb", compresslevel=9) as fh:
        fh.write(_header("././@LongLink", size, typeflag))
        payload = _pax_record(size) if typeflag in (tarfile.XHDTYPE, tarfile.XGLTYPE) else b"a" * size
        fh.write(payload + _pad(size))
        fh.write(_header("cifar-10-batches-py/test_batch", 0, tarfile.REGTYPE))
        fh.write(b"\0" * 2 * tarfile.BLOCKSIZE)


def _peak_while(fn) -> tuple[Exception | None, int]:
    """(what ``fn()`` raised, peak bytes Python allocated meanwhile)."""
    tracemalloc.start()
    try:
        fn()
        err = None
    except Exception as exc:  # noqa: BLE001 - returned to the test
        err = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return err, peak


@pytest.mark.parametrize("typeflag", [tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
                                      tarfile.XGLTYPE], ids=["L", "K", "x", "g"])
def test_huge_header_record_is_refused_before_reading(tmp_path, typeflag):
    path = tmp_path / "cifar-10-python.tar.gz"
    _write_bomb(path, typeflag)
    assert path.stat().st_size < 100_000  # a small file that claims 16 MiB
    err, peak = _peak_while(lambda: read_tar_members(str(path), CAPS, 2**30))
    assert peak < 2 * 2**20, f"{peak:,} bytes allocated for a {path.stat().st_size:,}-byte archive (raised {err!r})"
    assert isinstance(err, ValueError), f"not refused: {err!r}"
    cap = f"{safe_io.MAX_TAR_HEADER_RECORD:,}"
    assert re.search(rf"^{re.escape(str(path))}: .*header record.*{BIG:,} bytes.*at most {cap} bytes", str(err)), err


def test_huge_header_record_through_the_loader(tmp_path):
    _write_bomb(tmp_path / "cifar-10-python.tar.gz", tarfile.GNUTYPE_LONGNAME)
    with pytest.raises(ValueError, match=rf"cifar-10-python\.tar\.gz: .*header record.*at most "
                                         rf"{safe_io.MAX_TAR_HEADER_RECORD:,} bytes"):
        load_image_dataset("cifar10", "test", data_dir=str(tmp_path))


def test_chain_of_header_records_is_refused(tmp_path):
    # thousands of empty pax headers ahead of one member: tarfile recurses once per record
    path = tmp_path / "chain.tar.gz"
    with gzip.open(path, "wb") as fh:
        fh.write(_header("././@PaxHeader", 0, tarfile.XHDTYPE) * 5000)
        fh.write(_header("test_batch", 0, tarfile.REGTYPE) + b"\0" * 1024)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: more than "
                                         rf"{safe_io.MAX_TAR_HEADER_READS} header reads"):
        read_tar_members(str(path), CAPS, 2**30)


def test_long_sparse_map_is_refused(tmp_path):
    # an old-GNU sparse member whose map goes on for 4,000 extension blocks (21 regions each)
    path = tmp_path / "sparse.tar.gz"
    region = b"%011o\0" % 1 + b"%011o\0" % 1
    ext = bytearray(region * 21 + b"\0" * (504 - 21 * 24) + b"\1" + b"\0" * 7)
    with gzip.open(path, "wb") as fh:
        fh.write(_header("test_batch", 0, tarfile.GNUTYPE_SPARSE, patch={482: 1}))
        fh.write(bytes(ext) * 4000 + b"\0" * 2048)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: more than "
                                         rf"{safe_io.MAX_TAR_HEADER_READS} header reads"):
        read_tar_members(str(path), CAPS, 2**30)


def test_header_records_of_the_whole_archive_are_capped(tmp_path):
    # each long name is within the per-record cap, all of them together are not
    path = tmp_path / "names.tar.gz"
    n = safe_io.MAX_TAR_HEADER_BYTES // safe_io.MAX_TAR_HEADER_RECORD + 2
    name = b"d/" * (safe_io.MAX_TAR_HEADER_RECORD // 2 - 1) + b"x"
    with gzip.open(path, "wb") as fh:
        for _ in range(n):
            fh.write(_header("././@LongLink", len(name), tarfile.GNUTYPE_LONGNAME) + name + _pad(len(name)))
            fh.write(_header("x", 0, tarfile.REGTYPE))
        fh.write(b"\0" * 1024)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: header records add up to more than "
                                         rf"{safe_io.MAX_TAR_HEADER_BYTES:,} bytes"):
        read_tar_members(str(path), CAPS, 2**30)


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["gnu", "pax"])
def test_long_names_and_pax_headers_within_the_caps_still_read(tmp_path, fmt):
    src = tmp_path / ("d" * 150) / "é"
    _write_cifar10(str(src), np.random.default_rng(0))
    path = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(path, "w:gz", format=fmt, pax_headers={"comment": "c" * 1000}) as tar:
        tar.add(src / "cifar-10-batches-py", arcname=f"{'d' * 150}/é/cifar-10-batches-py")
    out = read_tar_members(str(path), CAPS, 2**30)
    assert sorted(out) == ["batches.meta", "test_batch"]
    assert out["test_batch"] == (src / "cifar-10-batches-py" / "test_batch").read_bytes()
    ref = load_image_dataset("cifar10", "test", data_dir=str(src))
    ds = load_image_dataset("cifar10", "test", data_dir=str(path))
    assert ds.labels.tolist() == ref.labels.tolist()


def test_plain_archive_members_count_and_sizes_still_capped(tmp_path):
    _write_cifar10(str(tmp_path), np.random.default_rng(1))
    path = _tar(str(tmp_path), "cifar-10-batches-py", "cifar-10-python.tar.gz")
    size = (tmp_path / "cifar-10-batches-py" / "test_batch").stat().st_size
    assert read_tar_members(path, CAPS, 2**30)["test_batch"] == \
        (tmp_path / "cifar-10-batches-py" / "test_batch").read_bytes()
    with pytest.raises(ValueError, match=rf"member cifar-10-batches-py/test_batch: {size:,} bytes, more than "
                                         "a test batch can be"):
        read_tar_members(path, {"test_batch": (size - 1, "a test batch")}, 2**30)
    with pytest.raises(ValueError, match="members add up to more than 1,000 bytes"):
        read_tar_members(path, CAPS, 1000)
