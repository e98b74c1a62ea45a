"""The claim statement of one lane: its conditions (``dequeue_filter``, the pause guard,
``pre_dequeue``) and its limits (``control.limits``), and running it.

A lane without limits claims in one autocommit statement. A lane with limits claims in
a short transaction holding the handler's lock (``sql.limits``); when such a claim
comes back empty, a cheap probe tells a queue held back by a limit from an empty one,
so the dispatcher polls again soon instead of backing off.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.db import models

from ..control.fair import REFRESH, SLOW_REFRESH, FairWeights, fair_index_name
from ..control.limits import Limits
from ..control.models import Pause, RateBucket
from ..sql.connection import Runner
from ..sql.fair import FairClaims
from ..sql.filters import FILTER_ERRORS, compile_filter
from ..sql.limits import LOCK_CLASS, LimitedClaim, LimitedClaims
from ..sql.pause import not_paused
from .logs import extra

if TYPE_CHECKING:
    from .lane import Lane

logger = logging.getLogger("django_dbworker.lane")

#: What ``conditions()`` returns when ``pre_dequeue`` said "not now".
NOT_NOW = None
#: Most claim statements one claim of a lane with per-key limits runs (see ``run``).
MAX_ROUNDS = 8
#: Shortest pause between two claims of a lane held back by a rate limit.
MIN_LIMIT_POLL = 0.005
#: The first number of the lock that serialises a fair handler's claims on MariaDB.
FAIR_LOCK_CLASS = LOCK_CLASS + 1
#: Most claim statements one fair claim runs (see ``_run_fair``).
FAIR_ROUNDS = 4

Conditions = tuple[str, dict[str, Any]]


class Claimer:
    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.handler = lane.handler
        self.stmts = lane.stmts
        #: The handler's limits (None: it has none, or a testing helper runs it).
        self.limits = Limits.of(self.handler)
        #: The last claim took fewer rows than asked while claimable rows were left: a
        #: limit held them back (only lanes with limits know it).
        self.held_back = False
        self._static: Conditions | None = None
        self._limited: LimitedClaims | None = None
        #: The handler's fair claims (``fair_by``) and the weights of their keys.
        self._fair: FairClaims | None = None
        self._weights = None
        if self.handler.fair_by:
            # Where indexes take no condition (MariaDB), listing the keys reads every
            # claimable row: less often.
            slow = not self.stmts.dialect.partial_indexes
            refresh = SLOW_REFRESH if slow else REFRESH
            self._weights = FairWeights(self.handler, lane.model, refresh)

    # -- conditions ------------------------------------------------------------------

    def conditions(self, conn: Runner) -> Conditions | None:
        """The extra WHERE of this claim and its parameters; None for "not now"."""
        if self._static is None:
            self._static = self._build_static(conn)
        where, params = self._static
        if self.handler.uses_pre_dequeue():
            dynamic = self._pre_dequeue(conn)
            if dynamic is NOT_NOW:
                return NOT_NOW
            if dynamic[0]:
                where = f"({where}) AND ({dynamic[0]})" if where else dynamic[0]
                params = {**params, **dynamic[1]}
        return where, params

    def _build_static(self, conn: Runner) -> Conditions:
        q = self.handler.dequeue_filter
        lane = self.lane
        try:
            compiled = (
                compile_filter(lane.model, q, conn.wrapper, self.stmts.col["pk"], "static")
                if q
                else ("", {})
            )
        except FILTER_ERRORS as exc:  # the system check dbworker.E004 says so at start
            logger.error(
                "%s: dequeue_filter cannot be used (%s: %s); this handler claims nothing.",
                lane.label,
                type(exc).__name__,
                exc,
                extra=extra("filter_refused", worker=lane.worker_id, handler=lane.label),
            )
            compiled = None
        static = compiled if compiled is not None else ("FALSE", {})
        if self.handler.fair_by:
            field = self.handler.fair_by
            index = fair_index_name(lane.model, field)
            self._fair = FairClaims(self.stmts, field, lane.order_by, static, index)
        if self.limits is not None:
            self._limited = LimitedClaims(
                self.stmts,
                self.limits,
                self.handler.ordering,
                static,
                RateBucket,
                lane.alias,
                self._fair,
            )
        guard, guard_params = not_paused(self.handler, self.stmts, lane.alias, Pause)
        if guard:
            static = (
                f"({static[0]}) AND {guard}" if static[0] else guard,
                {**static[1], **guard_params},
            )
        return static

    def _pre_dequeue(self, conn: Runner) -> Conditions | None:
        label = self.lane.label
        try:
            verdict = self.handler.pre_dequeue()
        except Exception:
            logger.exception("%s: pre_dequeue raised; not claiming this round", label)
            return NOT_NOW
        if verdict is False:
            return NOT_NOW
        if verdict is True or verdict is None:
            return "", {}
        if isinstance(verdict, models.Q):
            try:
                compiled = compile_filter(
                    self.lane.model, verdict, conn.wrapper, self.stmts.col["pk"], "dynamic"
                )
            except FILTER_ERRORS as exc:
                logger.error(
                    "%s: pre_dequeue returned a Q that cannot be used (%s: %s); not claiming.",
                    label,
                    type(exc).__name__,
                    exc,
                )
                return NOT_NOW
            return NOT_NOW if compiled is None else compiled
        logger.error(
            "%s: pre_dequeue returned %r; expected True, False, None or a Q. Not claiming.",
            label,
            verdict,
        )
        return NOT_NOW

    # -- running the claim -----------------------------------------------------------

    def run(
        self,
        conn: Runner,
        where: str,
        params: Mapping[str, Any],
        limit: int,
        *,
        fresh_only: bool = False,
    ) -> list[tuple[Any, ...]]:
        """Claim up to ``limit`` rows that match ``where`` (with ``params``: the claim's
        own, the worker's and ``held``'s) and the limits; the rows claimed.
        ``fresh_only``: no job the resetter brought back (the lane's quarantine); with
        per-key limits such a job still holds its place in its key's order."""
        stmts, attempts = self.stmts, self.handler.attempts_field
        first_claim = self.handler.first_claim_field
        limited = self._limited if self.limits is not None else None
        per_key = limited is not None and limited.key is not None
        if fresh_only and not per_key:
            fresh = f"{stmts.col['num_resets']} = 0"
            where = f"({where}) AND {fresh}" if where else fresh
        fair, weighted = self._fair, self._weights is not None and self._weights.weighted
        if fair is not None and weighted:
            params = {**params, **self._fair_params(conn, fair, where, params)}
        if limited is None and fair is not None:
            return self._run_fair(conn, fair, where, params, limit, weighted)
        if limited is None:
            return conn.execute(
                stmts.claim(
                    self.lane.order_by,
                    where,
                    attempts,
                    first_claim,
                    limit=limit,
                    max_retries=params["max_retries"],
                ),
                params,
            )
        rows: list[tuple[Any, ...]] = []
        # Per key, a round looks at a window of the queue's head; when one key fills it,
        # the round takes what that key has left, which leaves the key full: the next
        # round sees past it. So go on while rounds take something.
        for _ in range(MAX_ROUNDS if limited.key is not None or fair is not None else 1):
            wanted = limit - len(rows)
            claim = limited.claim(
                where,
                attempts,
                wanted,
                fresh_only=fresh_only and per_key,
                first_claim=first_claim,
                weighted=weighted,
            )
            values = {**claim.params, **params, "limit": wanted}
            got = conn.execute_locked(
                claim.lock, claim.claim_sql, values, self._spends(claim), claim.pick
            )
            rows += got
            if not got or len(rows) >= limit:
                break
        self.held_back = len(rows) < limit and (
            bool(rows) or bool(conn.execute(limited.probe(where), params))
        )
        return rows

    def _run_fair(
        self,
        conn: Runner,
        fair: FairClaims,
        where: str,
        params: Mapping[str, Any],
        limit: int,
        weighted: bool,
    ) -> list[tuple[Any, ...]]:
        """A fair claim without limits: one statement (PostgreSQL, SQLite); on MariaDB a
        pick and a write under the handler's lock, as a limited claim. A claim takes each
        key's share: one that comes back short (keys with fewer jobs than their share,
        rows another worker locked) claims again, until a round takes nothing (a short
        claim tells the dispatcher that the queue is drained)."""
        attempts, first_claim = self.handler.attempts_field, self.handler.first_claim_field
        rows: list[tuple[Any, ...]] = []
        for _ in range(FAIR_ROUNDS):
            wanted = limit - len(rows)
            values = {**fair.params, **params, "limit": wanted}
            max_retries = params["max_retries"]
            if self.stmts.dialect.update_returning:
                sql = fair.claim(where, attempts, first_claim, wanted, max_retries, weighted)
                got = conn.execute(sql, values)
            else:
                sql, pick = fair.pick(where, attempts, first_claim, wanted, weighted)
                lock = (FAIR_LOCK_CLASS, Limits(name=self.handler.get_name()).lock_id)
                got = conn.execute_locked(lock, sql, values, lambda rows: [], pick)
            rows += got
            if not got or len(rows) >= limit:
                break
        return rows

    def _fair_params(
        self, conn: Runner, fair: FairClaims, where: str, params: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The weights of the keys with claimable rows (``FairWeights``)."""
        assert self._weights is not None

        def list_keys() -> list[tuple[Any, ...]]:
            return conn.execute(fair.keys_sql(where), {**fair.params, **params})

        return fair.weights_param(self._weights.current(list_keys))

    def _spends(self, claim: LimitedClaim) -> Any:
        """What ``execute_locked`` runs after the claim: each rate bucket spent for the
        claimed rows (SQLite)."""

        def then(rows: list[tuple[Any, ...]]) -> list[tuple[str, Mapping[str, Any]]]:
            if not rows or not claim.spends:
                return []
            index = self.stmts.rows.pk_index
            ids = self.stmts.ids_param([self.stmts.key(row[index]) for row in rows])
            return [(sql, {**claim.params, "ids": ids}) for sql in claim.spends]

        return then

    def poll_delay(self, interval: float) -> float | None:
        """Seconds until a lane held back by its limits claims again. A rate limit
        gives a token back soon: claim then (with some jitter, so that workers do not
        claim in step). A concurrency limit frees a slot when a job ends, and the worker
        of that job claims again at once itself: other workers back off like idle ones
        (None)."""
        assert self.limits is not None
        soon = self.limits.poll_after()
        if soon is None:
            return None
        return min(interval, max(soon, MIN_LIMIT_POLL) * random.uniform(1.0, 1.5))
