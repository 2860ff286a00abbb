"""``jobs/local/loader_probe.py`` on CPU: the loader's time per batch with and without
SCNet's tables, what a loader process's batch costs to unpack, and whole passes with one
and two prefetch threads and with two loader processes (their tables compiled, then by
torch operations), each handing over every batch of the epoch."""

from __future__ import annotations

import json

import pytest
from lartpc.jobs.local import loader_probe, table_cache_start

from lartpc.data.store import EventStore


def test_the_probe_times_batches_and_passes(train_events_dir, capsys):
    assert loader_probe.main([str(train_events_dir), "--device", "cpu", "--threads", "1,2",
                              "--processes", "2", "--batches", "6", "--warmup", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device"] == "cpu" and out["events"] == 70 and out["shape"] == [400, 400]
    bare = out["produce"]["no_tables"]
    ways = [f"tables_{way}{pad}" for way in ("auto", "torch")
            for pad in ("", "_pad_after", "_pad_in_place")]
    cache = ["table_cache", "table_cache_pad_in_place"]  # joined from every event's own
    assert set(out["produce"]) == {"no_tables", "unpack", "table_cache_start", *ways, *cache}
    start = out["produce"]["table_cache_start"]
    assert start["seconds"] > 0 and start["mb"] > 0
    unpacked = out["produce"]["unpack"]  # a process's batch with its tables, as sent
    assert unpacked["repeats"] == 200 and unpacked["skeleton_bytes"] > 0
    assert unpacked["loads_us"] > 0 and unpacked["unpack_us"] > 0
    for tables in (out["produce"][way] for way in [*ways, *cache]):
        assert tables["batches"] == bare["batches"] == 4
        assert tables["done_ms"] >= tables["host_ms"] > 0 and bare["host_ms"] > 0
    assert out["threads_tables"] == "auto"
    assert [(p["threads"], p["processes"], p.get("tables"), p.get("table_cache"))
            for p in out["threads"]] == [
        (1, 0, None, None), (2, 0, None, None), (1, 0, None, True), (2, 0, None, True),
        (1, 2, "auto", None), (1, 2, "torch", None)]
    # each timed pass the second (the first warms the threads' and processes' memory)
    assert all(p["batches"] == 10 and p["warm"] and p["images_per_s"] > 0
               and p["own_cpu_ms_per_batch"] > 0 for p in out["threads"])


def test_the_table_cache_start_probe(train_events_dir, capsys):
    """``jobs/local/table_cache_start.py``: the store's events taken twice over, their
    tables made once, with the seconds and memory; a bad ``--copies`` is refused."""
    st = EventStore(train_events_dir)
    pixels = sum(len(e.row) for e in st.read_many(range(len(st))))
    assert table_cache_start.main([str(train_events_dir), "--copies", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["events"], out["copies"], out["image"], out["sites"]) == (
        2 * len(st), 2, [400, 400], 2 * pixels)
    assert out["tables_mb"] > 0 and out["seconds"] > 0
    assert isinstance(out["resident_growth_mb"], float)
    assert out["peak_growth_mb"] is None or out["peak_growth_mb"] > 0
    with pytest.raises(SystemExit) as stop:
        table_cache_start.main([str(train_events_dir), "--copies", "0"])
    assert stop.value.code == 2 and "--copies must be at least 1" in capsys.readouterr().err
