"""Fair claims: the claim of a handler with ``fair_by`` shares the free slots among the
values of a field (tenants), instead of taking the oldest rows whoever they belong to.

Each key with claimable rows gets a share in proportion to its weight (1 unless the
handler's ``fair_weights`` says otherwise). The candidates of a key are its first rows
in the handler's ``ordering``, numbered 1, 2, … (its rank); each candidate's score is

    (the key's rows in processing + its rank) / the key's weight

and the claim takes the candidates of the lowest scores (ties in random order, so no
key wins them all). A key that runs few jobs for its weight comes first: with 16
slots, a tenant that enqueues 100 jobs behind another's 100,000 gets its share of the
slots at the next claim (weighted max-min fairness of the running slots). Within a key
the rows keep the handler's ordering; across keys ``ordering`` does not apply.

PostgreSQL reads only what it takes: the keys that have claimable rows are found with a
recursive "loose index scan" (one index probe per key, over ``fair_index()``: the
fair field first, restricted to the claimable rows), then the first few claimable rows
of each key (``LATERAL``, as many as the key's share of the claim needs, twice over),
and the chosen rows are locked in score order with ``FOR NO KEY UPDATE SKIP LOCKED``
up to the claim's size. SQLite (one writer, no ``LATERAL``) finds the keys the same way
and each key's first rows by a correlated ``IN (… LIMIT)``. MariaDB (neither) numbers
the claimable rows of every key with a window function: its cost grows with the
claimable rows (see docs/flow-control.md § Fair claims).

The weights travel as a parameter: (key as text, weight) of each key whose weight is
not 1 (``weights_param``); ``keys_sql`` lists the keys with claimable rows for the
caller to weigh (``control.fair.FairWeights``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..states import JobState
from .dialects import param
from .jobs import PROCESSING, JobStatements
from .limits import Pick

#: The state index's predicate as its migration writes it (``models.state_index``):
#: SQLite reads a partial index only for a query that repeats its WHERE term for term.
STATE_INDEX_TERM = "{state} IN ({states})".format(
    state="{state}",
    states=", ".join(f"'{s.value}'" for s in JobState if s is not JobState.COMPLETED),
)

#: A key's candidates: up to this many times its share of the claim (and one more).
SHARE_FACTOR = 2
#: The candidates a claim of n rows may lock at most: n, and more where other claims
#: hold some (PostgreSQL).
CANDIDATES_FACTOR = 4


class FairClaims:
    """The fair claims of one handler on the job table of ``stmts``: ``field`` is the
    ``fair_by`` field; ``running`` the handler's ``dequeue_filter`` as SQL (what counts
    as its rows in processing)."""

    def __init__(
        self,
        stmts: JobStatements,
        field: str,
        ordering: str,
        running: tuple[str, dict[str, Any]],
        index: str | None = None,
    ) -> None:
        self.stmts = stmts
        #: The name of the fair index (``fair_index()``), where the model declares one.
        self.index = index
        self.d = stmts.dialect
        self.vendor = self.d.vendor
        self.f = stmts.column(field)
        self.ordering = ordering
        self.running_where = f" AND ({running[0]})" if running[0] else ""
        self.params: dict[str, Any] = dict(running[1])

    # -- pieces ----------------------------------------------------------------------

    def _key(self, value: str) -> str:
        """A key as it is grouped and compared (byte for byte on MariaDB)."""
        return self.d.exact(value)

    def _weights(self) -> str:
        """A derived table ``dbw_fw(dbw_k, dbw_w)`` of the ``dbw_fair`` parameter."""
        name = param("dbw_fair")
        if self.vendor == "postgresql":
            return (
                f"(SELECT e ->> 0 AS dbw_k, (e ->> 1)::float8 AS dbw_w "
                f"FROM jsonb_array_elements({name}::jsonb) AS e) AS dbw_fw"
            )
        if self.vendor == "sqlite":
            return (
                "(SELECT json_extract(value, '$[0]') AS dbw_k, json_extract(value, '$[1]') "
                f"AS dbw_w FROM json_each({name})) AS dbw_fw"
            )
        return (
            f"(SELECT {self.d.exact('j.dbw_k')} AS dbw_k, j.dbw_w FROM JSON_TABLE({name}, "
            "'$[*]' COLUMNS (dbw_k VARCHAR(1024) PATH '$[0]', dbw_w DOUBLE PATH '$[1]')) "
            "AS j) AS dbw_fw"
        )

    def _text(self, value: str) -> str:
        """A key as the text the weights name it by (``keys_sql``'s second column)."""
        return self.d.key_text(value)

    def _run_cte(self) -> str:
        """``dbw_frun(dbw_k, dbw_n)``: the handler's rows in processing, per key."""
        t, state = self.stmts.table, self.stmts.col["state"]
        key = self._key(self.f)
        # SQLite: through the state index, not a scan of the table.
        hint = f" AND {STATE_INDEX_TERM.format(state=state)}" if self.vendor == "sqlite" else ""
        return (
            f"dbw_frun AS (SELECT {key} AS dbw_k, count(*) AS dbw_n FROM {t} "
            f"WHERE {state} = {PROCESSING}{hint}{self.running_where} GROUP BY {key})"
        )

    @staticmethod
    def _same(a: str, b: str) -> str:
        return f"({a} = {b} OR ({a} IS NULL AND {b} IS NULL))"

    def _keys_cte(self, where: str) -> str:
        """``dbw_keys(dbw_k)``: each key with claimable rows matching ``where``, and a
        NULL at the end (a recursive loose index scan: one probe per key)."""
        t, f, claimable = self.stmts.table, self.f, self.stmts.claimable
        first = f"SELECT {f} FROM {t} WHERE {claimable} AND {f} IS NOT NULL{where} ORDER BY {f}"
        step = (
            f"SELECT {f} FROM {t} WHERE {claimable} AND {f} > dbw_keys.dbw_k{where} "
            f"ORDER BY {f} LIMIT 1"
        )
        return (
            f"dbw_keys(dbw_k) AS (SELECT * FROM ({first} LIMIT 1) AS dbw_first UNION ALL "
            f"SELECT ({step}) FROM dbw_keys WHERE dbw_keys.dbw_k IS NOT NULL)"
        )

    def keys_sql(self, where: str) -> str:
        """→ (key, key as text) of each key with claimable rows matching ``where`` (its
        parameters are the claim's): what the weights are asked for. Rows whose key is
        NULL are one key of their own, weighed as 1."""
        extra = f" AND ({where})" if where else ""
        if self.vendor == "mysql":
            # Its fair index leads with the state (no partial indexes): the loose scan's
            # probes sorted every claimable row (645 ms behind 100,000), a grouping reads
            # them once.
            t, f = self.stmts.table, self.f
            return (
                f"SELECT MIN({f}), {self._text(f)} FROM {t} WHERE {self.stmts.claimable} "
                f"AND {f} IS NOT NULL{extra} GROUP BY {self._text(f)}"
            )
        return (
            f"WITH RECURSIVE {self._keys_cte(extra)} SELECT dbw_k, {self._text('dbw_k')} "
            "FROM dbw_keys WHERE dbw_k IS NOT NULL"
        )

    # -- the candidates ----------------------------------------------------------------

    def candidates(self, where: str, size: int, weighted: bool) -> tuple[str, str]:
        """(common table expressions, query): the query returns ``dbw_pk, dbw_score,
        dbw_tie`` (a random number: ties go either way) of
        the candidates of a claim of up to ``size`` rows among the claimable rows not
        held matching ``where`` (`` AND …``), to be taken lowest score first. The
        expressions start with ``RECURSIVE`` where they need it (PostgreSQL); put them
        first in the statement's WITH. ``weighted``: the statement takes the
        ``dbw_fair`` parameter (``weights_param``), else every weight is 1."""
        if self.vendor == "postgresql":
            return self._candidates_lateral(where, size, weighted)
        if self.vendor == "sqlite":
            return self._candidates_correlated(where, size, weighted)
        return self._candidates_window(where, size, weighted)

    def _weight(self, weighted: bool, key: str) -> tuple[str, str]:
        """(join, weight expression) of the key ``key``."""
        if not weighted:
            return "", "1.0"
        join = f" LEFT JOIN {self._weights()} ON dbw_fw.dbw_k = {self._text(key)}"
        return join, "COALESCE(dbw_fw.dbw_w, 1.0)"

    def _candidates_lateral(self, where: str, size: int, weighted: bool) -> tuple[str, str]:
        t, f, pk = self.stmts.table, self.f, self.stmts.col["pk"]
        mine = f"{self.stmts.claimable} AND {self.stmts.not_held}{where}"
        join, weight = self._weight(weighted, "k.dbw_k")
        nulls = f"SELECT 1 FROM {t} WHERE {mine} AND {f} IS NULL"
        keys = (
            f"dbw_fk AS (SELECT k.dbw_k, COALESCE(r.dbw_n, 0) AS dbw_n, {weight} AS dbw_w, "
            f"sum({weight}) OVER () AS dbw_total FROM (SELECT dbw_k FROM dbw_keys "
            f"WHERE dbw_k IS NOT NULL UNION ALL SELECT NULL WHERE EXISTS ({nulls})) AS k "
            f"LEFT JOIN dbw_frun AS r ON {self._same('r.dbw_k', 'k.dbw_k')}{join})"
        )
        share = (
            f"LEAST({int(size)}, "
            f"ceil({SHARE_FACTOR * int(size)} * fk.dbw_w / fk.dbw_total)::bigint + 1)"
        )

        # In the fair index's order (the key first: one key's rows, in ordering), and the
        # key as a range of one value, so that only that index gives this order: with
        # ``key = value`` the planner took the dequeue index in ``ordering`` as just as
        # good, and read it from its head, skipping the other keys' rows (a whole
        # backlog for the last key).
        order = f"{f}, {self.ordering}"
        same = f"{f} >= fk.dbw_k AND {f} <= fk.dbw_k"

        def rows(match: str) -> str:
            return (
                f"SELECT {pk} AS dbw_pk, row_number() OVER (ORDER BY {order}) AS dbw_rn "
                f"FROM {t} WHERE {mine} AND {match} ORDER BY {order} LIMIT {share}"
            )

        score = "(c.dbw_rn + fk.dbw_n)::float8 / fk.dbw_w"
        query = (
            f"SELECT c.dbw_pk, {score} AS dbw_score, random() AS dbw_tie FROM dbw_fk AS fk "
            f"CROSS JOIN LATERAL ({rows(same)}) AS c "
            f"UNION ALL SELECT c.dbw_pk, {score}, random() FROM dbw_fk AS fk "
            f"CROSS JOIN LATERAL ({rows(f'{f} IS NULL')}) AS c WHERE fk.dbw_k IS NULL"
        )
        ctes = f"RECURSIVE {self._keys_cte(where)}, {self._run_cte()}, {keys}"
        return ctes, query

    def _candidates_correlated(self, where: str, size: int, weighted: bool) -> tuple[str, str]:
        """SQLite (no LATERAL): the keys by the loose index scan, then each key's first
        ``size`` rows by a correlated ``IN (… LIMIT)``, numbered per key."""
        t, f, pk = self.stmts.table, self.f, self.stmts.col["pk"]
        mine = f"{self.stmts.claimable} AND {self.stmts.not_held}{where}"
        order = f"{f}, {self.ordering}"
        firsts = (
            f"SELECT {pk} FROM {t} WHERE {mine} AND {f} = dbw_keys.dbw_k "
            f"ORDER BY {order} LIMIT {int(size)}"
        )
        keyed = (
            f"SELECT {t}.{pk} AS dbw_pk, dbw_keys.dbw_k AS dbw_k, row_number() OVER "
            f"(PARTITION BY dbw_keys.dbw_k ORDER BY {self.ordering}) AS dbw_rn "
            f"FROM dbw_keys JOIN {t} ON {t}.{pk} IN ({firsts}) "
            "WHERE dbw_keys.dbw_k IS NOT NULL"
        )
        # The keyless rows through the fair index, named: without statistics SQLite
        # takes ``key IS NULL`` for most of the table, and scanned it.
        hint = ""
        if self.index:
            hint = f" INDEXED BY {self.stmts._connection.ops.quote_name(self.index)}"
        keyless = (
            f"SELECT {t}.{pk}, NULL, row_number() OVER (ORDER BY {self.ordering}) FROM {t} "
            f"WHERE {t}.{pk} IN (SELECT {pk} FROM {t}{hint} WHERE {mine} AND {f} IS NULL "
            f"ORDER BY {order} LIMIT {int(size)})"
        )
        join, weight = self._weight(weighted, "c.dbw_k")
        query = (
            f"SELECT c.dbw_pk, (c.dbw_rn + COALESCE(r.dbw_n, 0)) * 1.0 / {weight} AS dbw_score, "
            f"{self.random} AS dbw_tie FROM ({keyed} UNION ALL {keyless}) AS c "
            f"LEFT JOIN dbw_frun AS r ON {self._same('r.dbw_k', 'c.dbw_k')}{join}"
        )
        return f"RECURSIVE {self._keys_cte(where)}, {self._run_cte()}", query

    def _candidates_window(self, where: str, size: int, weighted: bool) -> tuple[str, str]:
        t, f, pk = self.stmts.table, self.f, self.stmts.col["pk"]
        key = self._key(f)
        mine = f"{self.stmts.claimable} AND {self.stmts.not_held}{where}"
        numbered = (
            f"SELECT {pk} AS dbw_pk, {key} AS dbw_k, row_number() OVER (PARTITION BY {key} "
            f"ORDER BY {self.ordering}) AS dbw_rn FROM {t} WHERE {mine}"
        )
        join, weight = self._weight(weighted, "c.dbw_k")
        query = (
            f"SELECT c.dbw_pk, (c.dbw_rn + COALESCE(r.dbw_n, 0)) * 1.0 / {weight} AS dbw_score, "
            f"{self.random} AS dbw_tie "
            f"FROM ({numbered}) AS c LEFT JOIN dbw_frun AS r ON "
            f"{self._same('r.dbw_k', 'c.dbw_k')}{join} WHERE c.dbw_rn <= {int(size)}"
        )
        return self._run_cte(), query

    # -- the claim ---------------------------------------------------------------------

    def claim(
        self,
        where: str,
        attempts: str | None,
        first_claim: str | None,
        size: int,
        max_retries: int,
        weighted: bool,
    ) -> str:
        """The fair claim of up to ``size`` rows (PostgreSQL, SQLite) with the extra
        conditions ``where`` (its parameters are the caller's, with ``worker``,
        ``held`` and, ``weighted``, ``dbw_fair``)."""
        stmts, d = self.stmts, self.d
        pk = stmts.col["pk"]
        extra = f" AND ({where})" if where else ""
        ctes, query = self.candidates(extra, size, weighted)
        chosen = self.chosen(query, size)
        update = (
            f"{stmts.claim_head(attempts, first_claim)} WHERE {d.among(pk, chosen)} "
            f"{stmts.claim_returning}"
        )
        sql = d.ordered(update, self.ordering, ctes=ctes)
        if d.limit_written:
            sql = sql.replace(param("max_retries"), str(int(max_retries)))
        return sql

    def pick(
        self, where: str, attempts: str | None, first_claim: str | None, size: int, weighted: bool
    ) -> tuple[str, Pick]:
        """MariaDB's fair claim (no ``UPDATE … RETURNING``): (the claim of the keys in
        ``ids``, the ``Pick`` that chooses them), run under a lock of the handler
        (``Connection.execute_locked``) as a limited claim is."""
        stmts, d = self.stmts, self.d
        t, pk = stmts.table, stmts.col["pk"]
        extra = f" AND ({where})" if where else ""
        ctes, query = self.candidates(extra, size, weighted)
        keys = f"WITH {ctes} {self.chosen(query, '%(dbw_allowed)s')}"
        sql = (
            f"{stmts.claim_head(attempts, first_claim)} WHERE {pk} IN (SELECT {pk} "
            f"FROM {t} WHERE {pk} {d.in_ids('ids', stmts._pk_type)} AND {stmts.claimable}"
            f"{d.skip_locked}) {stmts.claim_returning}"
        )
        return sql, Pick("SELECT %(limit)s", keys)

    def chosen(self, query: str, size: int | str, *, lock: bool = True) -> str:
        """The keys of the candidates of ``query`` to take: up to ``size`` (a number or
        an SQL expression), lowest score first; on PostgreSQL (``lock``) each locked
        (skipping those another transaction holds) and checked claimable as it is now."""
        t, pk, d = self.stmts.table, self.stmts.col["pk"], self.d
        order = "dbw_c.dbw_score, dbw_c.dbw_tie"
        if lock and d.row_locks and d.update_returning:  # PostgreSQL: lock in order, skip, stop
            # The best candidates first, so many that the planner sees they are few and
            # looks each one up by key (it hashed the whole queue otherwise).
            best = self.best(query, CANDIDATES_FACTOR * int(size))
            return (
                f"SELECT {t}.{pk} FROM {best} AS dbw_c JOIN {t} ON {t}.{pk} = dbw_c.dbw_pk "
                f"WHERE {self.stmts.claimable} ORDER BY {order} LIMIT {size}"
                f" FOR NO KEY UPDATE OF {t} SKIP LOCKED"
            )
        return f"SELECT dbw_c.dbw_pk FROM ({query}) AS dbw_c ORDER BY {order} LIMIT {size}"

    @staticmethod
    def best(query: str, most: int) -> str:
        """The ``most`` best candidates of ``query`` (a derived table)."""
        return (
            f"(SELECT * FROM ({query}) AS dbw_q ORDER BY dbw_q.dbw_score, dbw_q.dbw_tie "
            f"LIMIT {int(most)})"
        )

    @property
    def random(self) -> str:
        return "RAND()" if self.vendor == "mysql" else "random()"

    def weights_param(self, weights: Mapping[str, float]) -> dict[str, Any]:
        """The ``dbw_fair`` parameter: the keys (as ``keys_sql`` gave their text) whose
        weight is not 1."""
        import json

        pairs = [[key, float(w)] for key, w in weights.items() if w != 1]
        return {**self.params, "dbw_fair": json.dumps(pairs)}
