"""The claim of a handler with fleet-wide limits (a ``control.limits.Limits``, which this
layer takes as an argument and does not import).

The plain claim takes the first claimable rows in the handler's ordering. A limited
claim takes at most what the limits leave:

- ``max_concurrency`` minus the handler's rows in ``processing`` (the handler's: those
  its ``dequeue_filter`` matches), and the whole tokens of its rate bucket;
- per key of ``concurrency_key``: rows are numbered per key in ordering
  (``row_number() OVER (PARTITION BY key …)``) and a row is taken only if its number
  fits what its key has left: ``max_concurrency_per_key`` minus that key's rows in
  ``processing``, and the whole tokens of the key's bucket. Keys with nothing left
  are excluded before the numbering, so they never hold up the others (rows of other
  keys behind them in the queue); the numbering looks at a window of the first
  ``WINDOW_FACTOR × limit`` rows that remain. Rows whose key is NULL are not limited
  per key. The cost: the scan reads past the claimable rows of full keys (about
  0.5 ms per 1,000 such rows on PostgreSQL), as with graphile-worker's queues.

The rows to take are chosen from the statement's snapshot and then locked (``SKIP
LOCKED``) with the claimable condition repeated, so a row changed meanwhile is
rechecked, never claimed in a state it left. What the counts and buckets read is only
right if no other claim of the handler commits meanwhile: the caller holds the
handler's lock for the transaction (``Connection.execute_locked``), and the buckets are
spent in the same transaction (on PostgreSQL in the same statement).

The window's size is written in the statement (one statement per size), not passed as
a parameter: knowing it, PostgreSQL finds the prepared statement's generic plan as
good as a custom one and stops planning the claim at each execution (about 1 ms of a
3 ms claim of 64 rows).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections, models

from .dialects import dialect_for
from .jobs import PROCESSING, JobStatements

if TYPE_CHECKING:
    from ..control.limits import Limits, RateLimit
    from .fair import FairClaims

#: The first number of the advisory lock that serialises a limited handler's claims.
LOCK_CLASS = 0x64627721  # "dbw!"
#: The per-key numbering looks at this many rows per row the claim may take ...
WINDOW_FACTOR = 2
#: ... and at least this many, rounded up to a power of two.
MIN_WINDOW = 64


@dataclasses.dataclass(frozen=True)
class LimitedClaim:
    """The statements of one limited handler's claims. ``sql()`` is the claim;
    ``spends`` (SQLite) spend the buckets after it, in its transaction."""

    claim_sql: str
    #: Statements that spend rate buckets for the claimed ``ids`` (SQLite; on
    #: PostgreSQL the claim statement spends them itself).
    spends: tuple[str, ...]
    #: The parameters all of them take besides the claim's own.
    params: dict[str, Any]
    #: (class, object) of the lock that serialises the handler's claims (PostgreSQL's
    #: advisory lock, MariaDB's named lock).
    lock: tuple[int, int]
    #: MariaDB/MySQL (no ``UPDATE … RETURNING``, no ``LIMIT`` of an expression): run
    #: first under the lock, ``pick.count_sql`` says how many rows the claim may take
    #: (``dbw_allowed``) and ``pick.keys_sql`` which (``ids``); ``claim_sql`` takes them.
    pick: Pick | None = None


@dataclasses.dataclass(frozen=True)
class Pick:
    """The choice of a limited claim as statements of their own (``LimitedClaim.pick``)."""

    count_sql: str
    keys_sql: str


class LimitedClaims:
    """Builds the claim of ``limits`` on the job table of ``stmts``; ``running`` is the
    handler's ``dequeue_filter`` as SQL (what counts as its rows in ``processing``)."""

    def __init__(
        self,
        stmts: JobStatements,
        limits: Limits,
        ordering: Sequence[str],
        running: tuple[str, dict[str, Any]],
        buckets: type[models.Model],
        alias: str,
        fair: FairClaims | None = None,
    ) -> None:
        self.stmts = stmts
        #: A fair claim (``fair_by``) chooses the candidates: the limits then apply to
        #: them as they do to the head of the queue.
        self.fair = fair
        self.limits = limits
        self.d = stmts.dialect
        self.columns = stmts.order_columns(ordering)
        self.ordering = stmts.order_by(ordering)
        self.running_where = f" AND ({running[0]})" if running[0] else ""
        quote = connections[alias].ops.quote_name
        self.buckets = quote(buckets._meta.db_table)
        self.key = stmts.column(limits.key) if limits.per_key and limits.key else None
        self.params: dict[str, Any] = dict(running[1])
        if fair is not None:
            self.params.update(fair.params)
        if limits.max_concurrency is not None:
            self.params["dbw_max"] = limits.max_concurrency
        if self.key is not None and limits.max_per_key is not None:
            self.params["dbw_per_key"] = limits.max_per_key
        for per_key, rate in ((False, limits.rate), (True, limits.rate_per_key)):
            if rate is not None:
                prefix = self._prefix(per_key)
                self.params[f"{prefix}_name"] = limits.bucket_name(per_key)
                self.params[f"{prefix}_rate"] = rate.rate
                self.params[f"{prefix}_burst"] = float(rate.capacity)
        self._cache: dict[tuple[Any, ...], LimitedClaim] = {}

    @staticmethod
    def _prefix(per_key: bool) -> str:
        return "dbw_krate" if per_key else "dbw_rate"

    # -- pieces ----------------------------------------------------------------------

    def _tokens(self, bucket: str, prefix: str) -> str:
        """The tokens of ``bucket`` (an alias of the bucket table) now: refilled since its
        ``at`` up to the burst."""
        now = "(SELECT t FROM dbw_clock)"
        return self.d.least(
            f"%({prefix}_burst)s", f"{bucket}.tokens + ({now} - {bucket}.at) * %({prefix}_rate)s"
        )

    def _running(self) -> str:
        t, col = self.stmts.table, self.stmts.col
        return f"SELECT count(*) FROM {t} WHERE {col['state']} = {PROCESSING}{self.running_where}"

    def _allowed(self) -> str:
        """How many rows the claim may take at most (whole handler)."""
        terms = ["%(limit)s"]
        if self.limits.max_concurrency is not None:
            terms.append(self.d.greatest("0", f"%(dbw_max)s - ({self._running()})"))
        if self.limits.rate is not None:
            name, empty = self.d.exact("%(dbw_rate_name)s"), self.d.exact("''")
            tokens = (
                f"SELECT {self._tokens('b', 'dbw_rate')} FROM {self.buckets} AS b "
                f"WHERE b.name = {name} AND b.{self._qn('key')} = {empty}"
            )
            terms.append(self.d.floor_int(f"COALESCE(({tokens}), %(dbw_rate_burst)s)"))
        return self.d.least(*terms) if len(terms) > 1 else terms[0]

    def _qn(self, name: str) -> str:
        return self.stmts._connection.ops.quote_name(name)

    def _ctes(self) -> str:
        t, col = self.stmts.table, self.stmts.col
        ctes = [f"dbw_clock AS (SELECT {self.d.epoch} AS t)"]
        if self.key is not None and self.limits.max_per_key is not None:
            key = self.d.exact(self.key)
            ctes.append(
                f"dbw_run AS (SELECT {key} AS dbw_k, count(*) AS dbw_n FROM {t} "
                f"WHERE {col['state']} = {PROCESSING} AND {self.key} IS NOT NULL"
                f"{self.running_where} GROUP BY {key})"
            )
        return ", ".join(ctes)

    def _pick(
        self, where: str, fresh_only: bool, window: int, weighted: bool = False
    ) -> tuple[str, str]:
        """(fair claims' common table expressions, the keys of the rows to take),
        chosen from the snapshot. ``fresh_only``: not the rows the resetter brought
        back, which still count in their key's order (the next job of the key waits
        for them). ``window``: see ``window()``; ``weighted``: see ``FairClaims``."""
        t, pk = self.stmts.table, self.stmts.col["pk"]
        base = f"{self.stmts.claimable} AND {self.stmts.not_held}{where}"
        fair = self.fair
        if self.key is None:
            if fair is not None:
                ctes, query = fair.candidates(where, window, weighted)
                return ctes, fair.chosen(query, "{allowed}", lock=False)
            pick = f"SELECT {pk} FROM {t} WHERE {base} ORDER BY {self.ordering} LIMIT {{allowed}}"
            return "", pick
        key = f"{t}.{self.key}"
        # Keys compared byte for byte (``Dialect.exact``), as the buckets hold them.
        exact = self.d.exact(key)
        # Keys with nothing left, as sets computed once (small: at most the rows in
        # processing, the buckets spent), so the scan only compares each row's key.
        full = []
        if self.limits.max_per_key is not None:
            full.append(
                self.d.not_among(exact, "SELECT dbw_k FROM dbw_run WHERE dbw_n >= %(dbw_per_key)s")
            )
        if self.limits.rate_per_key is not None:
            spent = (
                f"SELECT b.{self._qn('key')} FROM {self.buckets} AS b "
                f"WHERE b.name = {self.d.exact('%(dbw_krate_name)s')} "
                f"AND {self._tokens('b', 'dbw_krate')} < 1"
            )
            full.append(self.d.not_among(self.d.key_text(key), spent))
        excluded = [f"({key} IS NULL OR ({' AND '.join(full)}))"]
        aliases = [f"dbw_o{i}" for i in range(len(self.columns))]
        selected = ", ".join(
            f"{t}.{c} AS {a}" for (c, _), a in zip(self.columns, aliases, strict=True)
        )
        resets = f"{t}.{self.stmts.col['num_resets']}"
        order = ", ".join(
            f"{a} DESC" if desc else a for (_, desc), a in zip(self.columns, aliases, strict=True)
        )
        final, ctes = order.replace("dbw_o", "dbw_c.dbw_o"), ""
        if fair is None:
            head = (
                f"SELECT {t}.{pk} AS dbw_pk, {exact} AS dbw_k, {resets} AS dbw_resets, "
                f"{selected} FROM {t} WHERE {base} AND {' AND '.join(excluded)} "
                f"ORDER BY {self.ordering} LIMIT {int(window)}"
            )
        else:  # the fair candidates of the keys with something left, fairest first
            ctes, query = fair.candidates(f"{where} AND {' AND '.join(excluded)}", window, weighted)
            head = (
                f"SELECT {t}.{pk} AS dbw_pk, {exact} AS dbw_k, {resets} AS dbw_resets, "
                f"{selected}, dbw_f.dbw_score, dbw_f.dbw_tie "
                f"FROM {fair.best(query, window)} AS dbw_f "
                f"JOIN {t} ON {t}.{pk} = dbw_f.dbw_pk ORDER BY dbw_f.dbw_score, dbw_f.dbw_tie"
            )
            final = "dbw_c.dbw_score, dbw_c.dbw_tie"
        numbered = (
            f"SELECT dbw_w.*, row_number() OVER (PARTITION BY dbw_w.dbw_k ORDER BY {order}) "
            f"AS dbw_rn FROM ({head}) AS dbw_w"
        )
        joins, fits = "", []
        if self.limits.max_per_key is not None:
            joins += " LEFT JOIN dbw_run ON dbw_run.dbw_k = dbw_c.dbw_k"
            fits.append("dbw_c.dbw_rn + COALESCE(dbw_run.dbw_n, 0) <= %(dbw_per_key)s")
        if self.limits.rate_per_key is not None:
            joins += (
                f" LEFT JOIN {self.buckets} AS dbw_kb "
                f"ON dbw_kb.name = {self.d.exact('%(dbw_krate_name)s')} "
                f"AND dbw_kb.{self._qn('key')} = {self.d.key_text('dbw_c.dbw_k')}"
            )
            refilled = self._tokens("dbw_kb", "dbw_krate")
            tokens = self.d.floor_int(f"COALESCE({refilled}, %(dbw_krate_burst)s)")
            fits.append(f"dbw_c.dbw_rn <= {tokens}")
        fresh = "dbw_c.dbw_resets = 0 AND " if fresh_only else ""
        return ctes, (
            f"SELECT dbw_c.dbw_pk FROM ({numbered}) AS dbw_c{joins} "
            f"WHERE {fresh}(dbw_c.dbw_k IS NULL OR ({' AND '.join(fits)})) "
            f"ORDER BY {final} LIMIT {{allowed}}"
        )

    def _spend(self, per_key: bool, source: str, clock: str = "(SELECT t FROM dbw_clock)") -> str:
        """Take one token per claimed row from the handler's bucket (or each key's):
        ``source`` is ``FROM … WHERE …`` of the claimed rows, ``clock`` the time."""
        prefix = self._prefix(per_key)
        b = self.buckets
        key = self._qn("key")
        if per_key:
            assert self.key is not None
            value = self.d.key_text(self.key)
            group = f" AND {self.key} IS NOT NULL GROUP BY {self.d.exact(self.key)}"
        else:
            value, group = self.d.exact("''"), ""
        burst, rate = f"%({prefix}_burst)s", f"%({prefix}_rate)s"
        at, left = self.d.inserted("at"), self.d.inserted("tokens")
        refilled = self.d.least(burst, f"{b}.tokens + ({at} - {b}.at) * {rate}")
        tokens = f"{refilled} - ({burst} - {left})"
        spent = (
            f"SELECT {self.d.exact(f'%({prefix}_name)s')} AS name, {value} AS k, count(*) AS n, "
            f"{clock} AS at {source}{group} HAVING count(*) > 0"
        )
        # A bucket full again before this transaction ends (its refill outpaces the
        # claim: the rate is far from binding) is not written: every later claim reads
        # the clock after this one commits, and finds it full, as with no row at all.
        full_at = f"{self.d.greatest('s.at', 'COALESCE(cur.full_at, s.at)')} + s.n / {rate}"
        return (
            f"INSERT INTO {b} (name, {key}, tokens, at, full_at) "
            f"SELECT s.name, s.k, {burst} - s.n, s.at, s.at + s.n / {rate} FROM ({spent}) AS s "
            f"LEFT JOIN {b} AS cur ON cur.name = s.name AND cur.{key} = s.k "
            f"WHERE {full_at} > {self.d.epoch} "
            + self.d.update_on_conflict(
                ("name", key),
                # In this order: each reads the row as it was (MariaDB assigns left to
                # right here).
                [
                    ("full_at", f"{at} + ({burst} - ({tokens})) / {rate}"),
                    ("tokens", tokens),
                    ("at", at),
                ],
            )
        )

    # -- the statements --------------------------------------------------------------

    def claim(
        self,
        where: str,
        attempts: str | None,
        limit: int,
        *,
        fresh_only: bool = False,
        first_claim: str | None = None,
        weighted: bool = False,
    ) -> LimitedClaim:
        """The claim of up to ``limit`` rows (the ``limit`` parameter; here it sizes
        the per-key window) with the extra conditions ``where`` (its parameters are the
        caller's), for a handler whose claims append to ``attempts`` and set
        ``first_claim`` (``JobStatements.claim_head``; ``fresh_only``: see ``_pick``;
        per-key claims only)."""
        window = self.window(limit) if self.key is not None or self.fair else 0
        cache_key = (where, attempts, first_claim, fresh_only, window, weighted)
        cached = self._cache.get(cache_key)
        if cached is not None:
            return cached
        stmts, d = self.stmts, self.d
        t, pk = stmts.table, stmts.col["pk"]
        extra = f" AND ({where})" if where else ""
        rates = [per_key for per_key, rate in self._rates() if rate is not None]
        source = f"FROM {t} WHERE {pk} {d.in_ids('ids', stmts._pk_type)}"
        if not d.update_returning:  # MariaDB/MySQL: see ``LimitedClaim.pick``
            ctes = f"WITH {self._ctes()} "
            fair_ctes, keys = self._pick(extra, fresh_only, window, weighted)
            keys = keys.replace("{allowed}", "%(dbw_allowed)s")
            both = f"WITH {fair_ctes}, {self._ctes()} " if fair_ctes else ctes
            pick = Pick(f"{ctes}SELECT {self._allowed()}", both + keys)
            sql = (
                f"{stmts.claim_head(attempts, first_claim)} WHERE {pk} IN (SELECT {pk} "
                f"FROM {t} WHERE {pk} {d.in_ids('ids', stmts._pk_type)} AND {stmts.claimable}"
                f"{d.skip_locked}) {stmts.claim_returning}"
            )
            spends = tuple(self._spend(k, source, d.epoch) for k in rates)
            return self._keep(cache_key, LimitedClaim(sql, spends, self.params, self._lock, pick))
        fair_ctes, chosen = self._pick(extra, fresh_only, window, weighted)
        chosen = chosen.replace("{allowed}", self._allowed())
        ctes = f"{fair_ctes}, {self._ctes()}" if fair_ctes else self._ctes()
        # The picked keys as sets computed once: their number is an expression (the
        # allowance), and PostgreSQL would otherwise plan for a tenth of the table.
        locked = f"SELECT {pk} FROM {t} WHERE {d.among(pk, chosen)} AND {stmts.claimable}"
        update = (
            f"{stmts.claim_head(attempts, first_claim)} "
            f"WHERE {d.among(pk, locked + d.skip_locked)} "
            f"{stmts.claim_returning}"
        )
        if d.row_locks:  # PostgreSQL: the claim spends its tokens in the same statement
            spending = ", ".join(
                f"dbw_spent{int(k)} AS ({self._spend(k, 'FROM claimed WHERE TRUE')})" for k in rates
            )
            sql = d.ordered(update, self.ordering, ctes=ctes, after=spending)
            spends = ()
        else:
            sql = d.ordered(update, self.ordering, ctes=ctes)
            spends = tuple(
                f"WITH dbw_clock AS (SELECT {d.epoch} AS t) {self._spend(k, source)}" for k in rates
            )
        return self._keep(cache_key, LimitedClaim(sql, spends, self.params, self._lock))

    @property
    def _lock(self) -> tuple[int, int]:
        return (LOCK_CLASS, self.limits.lock_id)

    def _keep(self, cache_key: tuple[Any, ...], claim: LimitedClaim) -> LimitedClaim:
        if len(self._cache) < 16:
            self._cache[cache_key] = claim
        return claim

    def _rates(self) -> list[tuple[bool, RateLimit | None]]:
        return [(False, self.limits.rate), (True, self.limits.rate_per_key)]

    @staticmethod
    def window(limit: int) -> int:
        """Rows the per-key numbering looks at for a claim of up to ``limit`` rows: a
        power of two, so that a handler's claims need few statements."""
        return 1 << (max(limit * WINDOW_FACTOR, MIN_WINDOW) - 1).bit_length()

    def probe(self, where: str) -> str:
        """``SELECT 1`` if some row is claimable, limits aside (a claim that took
        nothing: was it held back, or is there nothing?)."""
        extra = f" AND ({where})" if where else ""
        return (
            f"SELECT 1 FROM {self.stmts.table} WHERE {self.stmts.claimable} "
            f"AND {self.stmts.not_held}{extra} LIMIT 1"
        )


def prune_buckets(buckets: type[models.Model], alias: str) -> str:
    """Delete the rate buckets that are full again (the same as no row)."""
    wrapper = connections[alias]
    table = wrapper.ops.quote_name(buckets._meta.db_table)
    return f"DELETE FROM {table} WHERE full_at < {dialect_for(wrapper).epoch}"
