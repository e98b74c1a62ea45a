"""WAL a drain writes per job, counted per relation with ``pg_walinspect`` (PostgreSQL
15+), so that other databases of the same server (a test run, another benchmark) do
not count.

    from benchmarks.wal import WalCounter
    counter = WalCounter(dsn, tables)      # before the drain
    ...
    counter.bytes()                        # after it: {"heap": …, "index": …, "commit": …}

Records of the tables' heap and of their indexes (and TOAST), by the relfilenodes they
touch, and the commit records of the transactions that wrote them. Full-page images
after a checkpoint count in (they are part of what a drain costs the server).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

#: The relfilenodes of ``tables``, their indexes and TOAST, by kind.
RELATIONS = """
SELECT c.relfilenode, CASE WHEN c.relkind = 'i' THEN 'index' ELSE 'heap' END
  FROM pg_class c
 WHERE c.oid = ANY(%(oids)s)
    OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = ANY(%(oids)s))
    OR c.oid IN (SELECT reltoastrelid FROM pg_class WHERE oid = ANY(%(oids)s))
"""


class WalCounter:
    def __init__(self, dsn: str, tables: list[str]) -> None:
        self.dsn = dsn
        self.tables = tables
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            self.start = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]

    def bytes(self) -> dict[str, int]:
        """WAL bytes since the counter was made, of the tables, by kind."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            oids = [
                conn.execute("SELECT %s::regclass::oid", [table]).fetchone()[0]  # type: ignore[index]
                for table in self.tables
            ]
            kinds: dict[int, str] = dict(conn.execute(RELATIONS, {"oids": oids}).fetchall())
            end = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
            _wait_flushed(conn, end)
            rows: list[Any] = conn.execute(
                "SELECT xid, record_length, resource_manager, block_ref "
                "FROM pg_get_wal_records_info(%s, %s)",
                [self.start, end],
            ).fetchall()
        totals = {"heap": 0, "index": 0, "commit": 0}
        xids: set[int] = set()
        commits: list[tuple[int, int]] = []
        for xid, length, manager, block_ref in rows:
            if manager == "Transaction":
                commits.append((int(xid), int(length)))
                continue
            kind = _kind_of(block_ref or "", kinds)
            if kind is not None:
                totals[kind] += int(length)
                xids.add(int(xid))
        totals["commit"] = sum(length for xid, length in commits if xid in xids)
        return totals


def _wait_flushed(conn: psycopg.Connection[Any], lsn: str, timeout: float = 10.0) -> None:
    """Wait until the WAL up to ``lsn`` is flushed: ``pg_walinspect`` reads no further
    ("cannot accept future end LSN"), and a system that commits asynchronously
    (pgqueuer) leaves WAL written but unflushed until the WAL writer flushes it, a
    few hundred milliseconds later."""
    deadline = time.monotonic() + timeout
    while not conn.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", [lsn]).fetchone()[0]:  # type: ignore[index]
        if time.monotonic() > deadline:
            raise RuntimeError(f"the WAL up to {lsn} was not flushed within {timeout:g} s")
        time.sleep(0.05)


def _kind_of(block_ref: str, kinds: dict[int, str]) -> str | None:
    """The kind of the first of our relations a record's blocks name (``blkref #0: rel
    1663/16384/24576 fork main blk 3``), if any."""
    for part in block_ref.split("rel ")[1:]:
        try:
            node = int(part.split()[0].split("/")[2])
        except (IndexError, ValueError):
            continue
        if node in kinds:
            return kinds[node]
    return None
