"""IndexFile and IndexService: the hash index from topic#key to CommitLog offsets (index_file.py)."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from data_plane.store.commit_log import DispatchRequest
from data_plane.store.index_file import (
    HASH_SLOT_SIZE,
    INDEX_ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    IndexFile,
    IndexService,
    index_file_size,
    key_hash,
)
from data_plane.store.layouts import INDEX_HEADER, INDEX_ITEM
from data_plane.store.mapped_file import offset_to_file_name
from data_plane.store.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
)
from tests.conftest import ManualClock

T0 = 1_700_000_000_000
FAR = 2**62

MakeIndexFile = Callable[..., IndexFile]
MakeService = Callable[..., IndexService]


@pytest.fixture
def make_file(tmp_path: Path) -> Iterator[MakeIndexFile]:
    made: list[IndexFile] = []

    def make(hash_slots: int = 16, max_entries: int = 64, name: int = T0) -> IndexFile:
        f = IndexFile(str(tmp_path / offset_to_file_name(name)), hash_slots, max_entries)
        made.append(f)
        return f

    yield make
    for f in made:
        f.mf.close()


@pytest.fixture
def make_service(tmp_path: Path, clock: ManualClock) -> Iterator[MakeService]:
    made: list[IndexService] = []

    def make(hash_slots: int = 16, max_entries: int = 64, *, load: bool = False) -> IndexService:
        s = IndexService(str(tmp_path / "index"), hash_slots, max_entries, clock_ms=clock)
        if load:
            s.load()
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def _query(f: IndexFile, key: str, max_num: int = 100, begin: int = 0, end: int = FAR) -> list[int]:
    out: list[int] = []
    f.query(key, begin, end, max_num, out)
    return out


def _req(
    offset: int, *, keys: str = "", uniq: str = "", ts: int = T0, topic: str = "T", sys_flag: int = 0
) -> DispatchRequest:
    return DispatchRequest(topic, 0, offset, 100, 0, ts, 0, keys, uniq, sys_flag)


# --- IndexFile -------------------------------------------------------------------------------
def test_the_file_size_is_header_slots_and_entries() -> None:
    assert INDEX_HEADER_SIZE == 40
    assert INDEX_ENTRY_SIZE == 20
    assert HASH_SLOT_SIZE == 4
    assert index_file_size(10, 100) == 40 + 10 * 4 + 100 * 20


def test_query_returns_the_offsets_of_a_key_newest_first(make_file: MakeIndexFile) -> None:
    f = make_file()
    for i, offset in enumerate([100, 250, 400, 777]):
        assert f.put_key("T#k", offset, T0 + i)
    assert f.put_key("T#other", 900, T0 + 5)
    assert _query(f, "T#k") == [777, 400, 250, 100]
    assert _query(f, "T#other") == [900]
    assert _query(f, "T#missing") == []
    assert f.index_count == 6  # entry 0 is never used
    assert f.begin_phy_offset == 100
    assert f.end_phy_offset == 900


def test_query_stops_at_max_num(make_file: MakeIndexFile) -> None:
    f = make_file()
    for offset in range(0, 1000, 100):
        f.put_key("T#k", offset, T0)
    assert _query(f, "T#k", max_num=3) == [900, 800, 700]


def test_query_keeps_only_entries_in_the_time_range(make_file: MakeIndexFile) -> None:
    f = make_file()
    f.put_key("T#k", 1, T0)
    f.put_key("T#k", 2, T0 + 5_000)
    f.put_key("T#k", 3, T0 + 10_000)
    assert _query(f, "T#k", begin=T0 + 4_000, end=T0 + 6_000) == [2]
    assert _query(f, "T#k", begin=T0 + 5_000, end=T0 + 10_000) == [3, 2]
    assert _query(f, "T#k", begin=T0 + 11_000, end=FAR) == []
    assert _query(f, "T#k", begin=0, end=T0 - 1_000) == []


@pytest.mark.parametrize(("begin", "end"), [(5500, 5500), (5001, 6000), (5400, 5600), (5500, 9999), (0, 5500)])
def test_query_finds_an_entry_stored_inside_the_range_between_whole_seconds(
    make_file: MakeIndexFile, begin: int, end: int
) -> None:
    # Entries keep whole seconds since the file's first entry: this one is known to have been
    # stored in [T0 + 5000, T0 + 5999]; a range holding its real time must still find it.
    f = make_file()
    f.put_key("T#k", 1, T0)
    f.put_key("T#k", 2, T0 + 5_500)
    assert 2 in _query(f, "T#k", begin=T0 + begin, end=T0 + end)


@pytest.mark.parametrize(("begin", "end"), [(0, 4_500), (0, 4_999), (6_000, 9_000)])
def test_query_leaves_out_an_entry_stored_outside_the_range(make_file: MakeIndexFile, begin: int, end: int) -> None:
    f = make_file()
    f.put_key("T#k", 1, T0 - 100_000)
    f.put_key("T#k", 2, T0 + 5_500)
    assert 2 not in _query(f, "T#k", begin=T0 + begin, end=T0 + end)


def test_keys_in_one_hash_slot_are_chained_and_told_apart_by_their_hash(make_file: MakeIndexFile, seed: int) -> None:
    rng = random.Random(seed)
    f = make_file(hash_slots=1, max_entries=200)
    keys = [f"T#key-{i}" for i in range(8)]
    assert len({key_hash(k) for k in keys}) == len(keys)
    expect: dict[str, list[int]] = {k: [] for k in keys}
    for offset in range(0, 150 * 64, 64):
        k = rng.choice(keys)
        assert f.put_key(k, offset, T0)
        expect[k].insert(0, offset)
    for k in keys:
        assert _query(f, k) == expect[k]


def test_a_full_file_refuses_more_keys(make_file: MakeIndexFile) -> None:
    f = make_file(max_entries=5)
    for i in range(4):  # entry 0 is never used: 4 fit
        assert f.put_key(f"T#k{i}", i, T0)
    assert f.is_full()
    assert not f.put_key("T#late", 99, T0)
    assert _query(f, "T#late") == []
    assert _query(f, "T#k3") == [3]


def test_the_header_is_written_with_the_first_key_and_on_close(make_file: MakeIndexFile, tmp_path: Path) -> None:
    f = make_file()
    f.put_key("T#a", 500, T0 + 1_000)
    header = INDEX_HEADER.unpack_from(f.mf.mv, 0)
    assert header == (T0 + 1_000, T0 + 1_000, 500, 500, 16, 2)
    f.put_key("T#b", 600, T0 + 3_000)
    assert f.close()
    with open(f.path, "rb") as fh:
        assert INDEX_HEADER.unpack(fh.read(INDEX_HEADER_SIZE)) == (T0 + 1_000, T0 + 3_000, 500, 600, 16, 3)


def test_recover_count_counts_the_entries_on_disk_when_the_header_count_is_stale(
    make_file: MakeIndexFile, tmp_path: Path
) -> None:
    f = make_file()
    for i in range(10):
        f.put_key(f"T#k{i % 3}", 1000 + i, T0 + i * 1000)
    # The header was written with the first key only (count 2); the process "dies" now.
    assert INDEX_HEADER.unpack_from(f.mf.mv, 0)[5] == 2
    assert f.mf.close()
    again = make_file()
    assert again.index_count == 2
    again.recover_count()
    assert again.index_count == 11
    assert again.end_phy_offset == 1009
    assert again.end_timestamp == T0 + 9_000
    assert _query(again, "T#k0") == [1009, 1006, 1003, 1000]
    assert again.put_key("T#k0", 2000, T0 + 20_000)
    assert _query(again, "T#k0") == [2000, 1009, 1006, 1003, 1000]


# --- IndexService ----------------------------------------------------------------------------
def test_build_indexes_the_uniq_key_and_each_space_separated_key(make_service: MakeService) -> None:
    s = make_service()
    s.build(_req(100, keys="order-1 user-7  cart", uniq="UNIQ-A"))
    s.build(_req(200, keys="order-2 user-7", uniq="UNIQ-B"))
    s.build(_req(300, topic="Other", keys="user-7"))
    assert s.query("T", "UNIQ-A", 10, 0, FAR) == [100]
    assert s.query("T", "UNIQ-B", 10, 0, FAR) == [200]
    assert s.query("T", "order-1", 10, 0, FAR) == [100]
    assert s.query("T", "cart", 10, 0, FAR) == [100]
    assert s.query("T", "user-7", 10, 0, FAR) == [200, 100]
    assert s.query("Other", "user-7", 10, 0, FAR) == [300]
    assert s.query("T", "", 10, 0, FAR) == []
    assert s.query("T", "order-1 user-7", 10, 0, FAR) == []


@pytest.mark.parametrize(
    ("sys_flag", "indexed"),
    [
        (TRANSACTION_NOT_TYPE, True),
        (TRANSACTION_PREPARED_TYPE, True),
        (TRANSACTION_COMMIT_TYPE, True),
        (TRANSACTION_ROLLBACK_TYPE, False),
    ],
)
def test_build_does_not_index_rolled_back_transaction_records(
    make_service: MakeService, sys_flag: int, indexed: bool
) -> None:
    s = make_service()
    s.build(_req(100, keys="k", uniq="U", sys_flag=sys_flag | 0x1))
    assert s.query("T", "k", 10, 0, FAR) == ([100] if indexed else [])
    assert s.query("T", "U", 10, 0, FAR) == ([100] if indexed else [])


def test_build_rolls_over_to_a_new_file_when_one_is_full_and_queries_span_files(
    make_service: MakeService, clock: ManualClock
) -> None:
    s = make_service(max_entries=4)  # 3 entries a file
    for i in range(10):
        clock.advance(1)
        s.build(_req(100 * i, keys="same", uniq=f"U{i}", ts=T0 + i * 1000))
    assert len(s.files) == 7  # 20 entries, 3 a file
    names = [int(f.mf.file_name) for f in s.files]
    assert names == sorted(set(names))
    assert sorted(os.listdir(s.directory)) == [f.mf.file_name for f in s.files]
    assert s.query("T", "same", 100, 0, FAR) == [900, 800, 700, 600, 500, 400, 300, 200, 100, 0]
    assert s.query("T", "same", 4, 0, FAR) == [900, 800, 700, 600]
    assert s.query("T", "U3", 100, 0, FAR) == [300]
    assert s.query("T", "same", 100, T0 + 2_000, T0 + 4_000) == [400, 300, 200]


def test_put_items_adds_fastpath_index_items_with_either_twin(make_service: MakeService, write_path: str) -> None:
    s = make_service(max_entries=8)
    s.ensure_writable()
    items = b"".join(INDEX_ITEM.pack(key_hash(f"T#k{i % 2}"), 100 * i) for i in range(20))
    s.put_items(items, T0)
    assert len(s.files) == 3  # 7 a file
    assert s.query("T", "k0", 100, 0, FAR) == [100 * i for i in range(18, -1, -2)]
    assert s.query("T", "k1", 100, 0, FAR) == [100 * i for i in range(19, 0, -2)]
    assert s.end_phy_offset() == 1900


def _three_files(make_service: MakeService, clock: ManualClock) -> IndexService:
    """A service of three files of three entries: [0, 100, 200], [300, 400, 500], [600, 700, 800]."""
    s = make_service(max_entries=4)
    for i in range(9):
        clock.advance(1)
        s.build(_req(100 * i, keys=f"k{i}"))
    return s


def test_truncate_after_deletes_files_with_entries_at_or_past_the_offset_and_says_where_to_rebuild(
    make_service: MakeService, clock: ManualClock
) -> None:
    s = _three_files(make_service, clock)
    assert len(s.files) == 3
    paths = [f.path for f in s.files]
    assert s.truncate_after(10_000) == -1  # nothing at or past it
    assert len(s.files) == 3
    assert s.truncate_after(450) == 300
    assert [f.path for f in s.files] == paths[:1]
    assert not os.path.exists(paths[1])
    assert not os.path.exists(paths[2])
    assert s.query("T", "k2", 10, 0, FAR) == [200]
    assert s.query("T", "k4", 10, 0, FAR) == []
    assert s.truncate_after(200) == 0  # the last entry of the first file is at 200
    assert s.files == []


def test_truncate_after_looks_past_an_empty_last_file(make_service: MakeService, clock: ManualClock) -> None:
    s = make_service(max_entries=4)
    for i in range(3):  # fills the first file: [0, 100, 200]
        s.build(_req(100 * i, keys=f"k{i}"))
    clock.advance(1)
    s.ensure_writable()  # what a start does when the last file is full: an empty new one
    assert len(s.files) == 2
    assert s.truncate_after(150) == 0
    assert s.query("T", "k2", 10, 0, FAR) == []


def test_delete_expired_deletes_files_pointing_below_the_offset_but_never_the_last(
    make_service: MakeService, clock: ManualClock
) -> None:
    s = make_service(max_entries=4)
    for i in range(9):
        clock.advance(1)
        s.build(_req(100 * i, keys=f"k{i}"))
    paths = [f.path for f in s.files]
    assert s.delete_expired(200) == 0  # the first file still points at 200
    assert s.delete_expired(201) == 1
    assert not os.path.exists(paths[0])
    assert s.query("T", "k1", 10, 0, FAR) == []
    assert s.query("T", "k3", 10, 0, FAR) == [300]
    assert s.delete_expired(10_000) == 1
    assert [f.path for f in s.files] == paths[2:]


def test_load_recovers_the_entry_count_of_each_file(make_service: MakeService, clock: ManualClock) -> None:
    s = make_service(max_entries=64)
    for i in range(20):
        s.build(_req(100 * i, keys="k", ts=T0 + i))
    for f in s.files:
        assert f.mf.close()  # die without writing the headers
    s.files = []
    again = make_service(max_entries=64, load=True)
    assert len(again.files) == 1
    assert again.files[0].index_count == 21
    assert again.end_phy_offset() == 1900
    assert again.query("T", "k", 100, 0, FAR) == [100 * i for i in range(19, -1, -1)]
    again.build(_req(2000, keys="k"))
    assert again.query("T", "k", 1, 0, FAR) == [2000]


def test_load_removes_an_index_file_of_another_geometry(make_service: MakeService, tmp_path: Path) -> None:
    s = make_service(max_entries=8)
    s.build(_req(0, keys="k"))
    path = s.files[0].path
    s.close()
    again = make_service(max_entries=16, load=True)
    assert again.files == []
    assert not os.path.exists(path)


def test_cut_drops_the_entries_past_the_offset_in_place_and_keeps_every_chain_before_it(
    make_service: MakeService, clock: ManualClock, seed: int
) -> None:
    """Four slots for eight keys: chains mix keys, and a cut lands in the middle of them."""
    rng = random.Random(seed)
    s = make_service(hash_slots=4, max_entries=256)
    indexed: list[tuple[int, str]] = []
    for i in range(120):
        key = f"k{rng.randrange(8)}"
        clock.advance(rng.randrange(3) * 1000)
        s.build(_req(100 * i, keys=key, ts=clock()))
        indexed.append((100 * i, key))
    path = s.files[0].path
    cut = 100 * rng.randrange(1, 119) + rng.choice((0, 50))
    s.cut(cut)
    assert [f.path for f in s.files] == [path]  # the same file, cut in place
    kept = [(phy, key) for phy, key in indexed if phy < cut]
    assert s.end_phy_offset() == kept[-1][0]
    for k in range(8):
        assert s.query("T", f"k{k}", 1000, 0, FAR) == [phy for phy, key in reversed(kept) if key == f"k{k}"]
    f = s.files[0]
    entries_end = INDEX_HEADER_SIZE + 4 * HASH_SLOT_SIZE + 121 * INDEX_ENTRY_SIZE
    assert bytes(f.mf.mv[INDEX_HEADER_SIZE + 4 * HASH_SLOT_SIZE + f.index_count * INDEX_ENTRY_SIZE : entries_end]) == (
        bytes(entries_end - INDEX_HEADER_SIZE - 4 * HASH_SLOT_SIZE - f.index_count * INDEX_ENTRY_SIZE)
    )
    # Entries added after the cut chain onto what was kept (and the file reads back the same).
    s.build(_req(cut + 7, keys="k0", ts=clock()))
    want = [cut + 7] + [phy for phy, key in reversed(kept) if key == "k0"]
    assert s.query("T", "k0", 1000, 0, FAR) == want
    s.close()
    again = make_service(hash_slots=4, max_entries=256, load=True)
    assert again.query("T", "k0", 1000, 0, FAR) == want
    assert again.end_phy_offset() == cut + 7


def test_cut_deletes_files_wholly_past_the_offset_and_keeps_an_empty_newer_one(
    make_service: MakeService, clock: ManualClock
) -> None:
    s = _three_files(make_service, clock)
    clock.advance(1)
    s.ensure_writable()  # an empty fourth file
    paths = [f.path for f in s.files]
    s.cut(10_000)  # nothing at or past it
    assert [f.path for f in s.files] == paths
    s.cut(450)
    assert [f.path for f in s.files] == [paths[0], paths[1], paths[3]]
    assert not os.path.exists(paths[2])
    assert s.files[1].index_count == 3  # 300 and 400 kept (entry 0 is never used)
    assert s.query("T", "k4", 10, 0, FAR) == [400]
    assert s.query("T", "k5", 10, 0, FAR) == []
    s.cut(0)  # every file with entries is wholly past it
    assert [f.path for f in s.files] == [paths[3]]
    assert s.end_phy_offset() == -1
