"""data_plane/store/layouts.py: each index layout defined once — the structs the Python twins
use, and the C header the compiled module includes, generated from the same definitions."""

from __future__ import annotations

import re
from pathlib import Path

from data_plane.store import layouts


def test_the_committed_c_header_is_the_one_the_definitions_generate() -> None:
    assert layouts.HEADER_PATH.read_text() == layouts.c_header(), (
        "data_plane/store/_layouts.h is stale: run `python -m data_plane.store.layouts`"
    )


def test_the_header_gives_each_size_and_field_offset_of_the_structs() -> None:
    defines = dict(re.findall(r"#define (\w+) (\d+)", layouts.c_header()))
    assert defines["CQ_UNIT_SIZE"] == "20"
    assert defines["INDEX_HEADER_SIZE"] == "40"
    assert defines["INDEX_ENTRY_SIZE"] == "20"
    assert defines["INDEX_ITEM_SIZE"] == "12"
    assert defines["HASH_SLOT_SIZE"] == "4"
    unit = layouts.CQ_UNIT.pack(0x0102030405060708, 0x11121314, 0x2122232425262728)
    at = int(defines["CQ_UNIT_TAGS_AT"])
    assert unit[at : at + 8] == bytes.fromhex("2122232425262728")
    entry = layouts.INDEX_ENTRY.pack(1, 0x0A0B0C0D0E0F1011, 3, 4)
    at = int(defines["INDEX_ENTRY_PHYS_AT"])
    assert entry[at : at + 8] == bytes.fromhex("0A0B0C0D0E0F1011")
    assert int(defines["INDEX_ENTRY_PREV_AT"]) == layouts.INDEX_ENTRY.size - 4


def test_no_other_module_spells_an_index_layout_out_again() -> None:
    formats = {s.format for s in (layouts.CQ_UNIT, layouts.INDEX_HEADER, layouts.INDEX_ENTRY, layouts.INDEX_ITEM)}
    store = Path(layouts.__file__).parent
    again = [
        f"{path.name}: {fmt}"
        for path in sorted(store.glob("*.py"))
        if path.name != "layouts.py"
        for fmt in formats
        if f'Struct("{fmt}")' in path.read_text()
    ]
    assert again == []
