"""MariaDB's statements with RETURNING, split into pick, write and read
(``sql.mysql_script.script``): what each part is, for every shape the statements take."""

from django_dbworker.sql.mysql_script import KEYS, PRIMARY, script


def test_a_fenced_update_picks_with_skip_locked_and_writes_by_keys():
    sql = (
        "UPDATE `t` SET `state` = 'completed', `log` = JSON_OBJECT('m', ')(') "
        "WHERE `id` IN (SELECT `id` FROM `t` WHERE `id` IN (SELECT 1) AND `state` = "
        "'processing' FOR UPDATE SKIP LOCKED) RETURNING `id`, `cancel`"
    )
    parts = script(sql)
    assert parts is not None
    # It returns no column it writes: the pick reads them, no read after the write.
    assert parts.pick == (
        "SELECT `id`, `cancel` FROM `t` WHERE `id` IN (SELECT 1) AND `state` = "
        "'processing' FOR UPDATE SKIP LOCKED"
    )
    assert parts.write == (
        f"UPDATE `t` {PRIMARY} SET `state` = 'completed', `log` = JSON_OBJECT('m', ')(') "
        f"WHERE `t`.`id` IN {KEYS}"
    )
    assert parts.read is None


def test_an_update_returning_what_it_writes_reads_it_after_the_write():
    sql = (
        "UPDATE `t` SET `t`.`state` = CASE WHEN `cancel` THEN 'canceled' ELSE 'failed' END, "
        "`n` = `n` + 1 WHERE `id` IN (SELECT `id` FROM `t` WHERE `id` = 1 FOR UPDATE SKIP "
        "LOCKED) RETURNING `state`"
    )
    parts = script(sql)
    assert parts is not None
    assert parts.pick == "SELECT `id` FROM `t` WHERE `id` = 1 FOR UPDATE SKIP LOCKED"
    assert parts.read == f"SELECT `state` FROM `t` WHERE `t`.`id` IN {KEYS}"


def test_a_claim_keeps_its_order_and_limit_in_the_pick():
    sql = (
        "UPDATE `t` SET `state` = 'processing', `x` = (SELECT 1 FROM y WHERE z) "
        "WHERE `id` IN (SELECT `id` FROM `t` WHERE `state` IN ('queued') ORDER BY `id` "
        "LIMIT %(limit)s FOR UPDATE SKIP LOCKED) RETURNING `t`.`id`, `t`.`state`"
    )
    parts = script(sql)
    assert parts is not None
    assert parts.pick.endswith("ORDER BY `id` LIMIT %(limit)s FOR UPDATE SKIP LOCKED")
    assert parts.read == f"SELECT `t`.`id`, `t`.`state` FROM `t` WHERE `t`.`id` IN {KEYS}"


def test_an_unfenced_update_locks_what_it_matches_and_waits():
    parts = script("UPDATE `w` SET `b` = 1 WHERE `worker_id` = %(worker_id)s RETURNING `id`")
    assert parts is not None
    assert parts.pick == "SELECT `id` FROM `w` WHERE `worker_id` = %(worker_id)s FOR UPDATE"
    # By the primary key only: a plain index on the key (what a partial index becomes
    # here) locked in the other order than a handler's job.save(), a deadlock.
    assert parts.write == f"UPDATE `w` {PRIMARY} SET `b` = 1 WHERE `w`.`id` IN {KEYS}"


def test_a_delete_returning_its_keys_needs_no_read():
    parts = script(
        "DELETE FROM `t` WHERE `id` IN (SELECT `id` FROM `t` WHERE `state` = %(state)s "
        "LIMIT %(batch)s FOR UPDATE SKIP LOCKED) RETURNING `id`"
    )
    assert parts is not None
    assert parts.read is None
    assert parts.write == f"DELETE FROM `t` WHERE `t`.`id` IN {KEYS}"


def test_other_statements_run_as_they_are():
    assert script("SELECT `id` FROM `t` WHERE `id` IN (1) FOR UPDATE SKIP LOCKED") is None
    assert script("UPDATE `t` SET `a` = 1 WHERE `id` = 2") is None
    assert script("INSERT INTO `t` (`a`) VALUES (1)") is None


def test_a_sorted_pick_reads_candidates_then_locks_them_by_key():
    from django_dbworker.sql.mysql_script import ranked_pick

    pick = (
        "SELECT `id` FROM `t` WHERE `state` IN ('queued') AND NOT (`id` IN (SELECT 1)) "
        "ORDER BY `priority` DESC, `id` LIMIT %(limit)s FOR UPDATE SKIP LOCKED"
    )
    ranked = ranked_pick(pick)
    assert ranked is not None
    assert ranked.candidates == (
        "SELECT `id` FROM `t` WHERE `state` IN ('queued') AND NOT (`id` IN (SELECT 1)) "
        f"ORDER BY `priority` DESC, `id` LIMIT {KEYS}"
    )
    assert ranked.lock == (
        f"SELECT `id` FROM `t` {PRIMARY} WHERE `id` IN {KEYS} AND (`state` IN ('queued') AND "
        "NOT (`id` IN (SELECT 1))) FOR UPDATE SKIP LOCKED"
    )
    assert ranked.limit == "%(limit)s"
    # Without ORDER BY (retention's batches) InnoDB stops at the limit: as it is.
    assert ranked_pick("SELECT `id` FROM `t` WHERE `a` LIMIT 5 FOR UPDATE SKIP LOCKED") is None


def test_a_claims_candidates_are_read_per_state_in_its_order():
    """A claim's candidates (queued or errored) are read each state apart, each in the
    claim's order, then the first of both: see tests/test_statements.py for the plan."""
    from django_dbworker.sql.mysql_script import ranked_pick

    pick = (
        "SELECT `id` FROM `t` WHERE `state` IN ('queued', 'errored') AND (`x` = 1) "
        "ORDER BY `priority` DESC, `id` LIMIT %(limit)s FOR UPDATE SKIP LOCKED"
    )
    ranked = ranked_pick(pick)
    branch = (
        "(SELECT `id`, `priority` AS dbw_o0, `id` AS dbw_o1 FROM `t` WHERE `state` = {} "
        f"AND (`x` = 1) ORDER BY `priority` DESC, `id` LIMIT {KEYS})"
    )
    queued, errored = branch.format("'queued'"), branch.format("'errored'")
    assert ranked.candidates == (
        f"SELECT `id` FROM ({queued} UNION ALL {errored}) AS dbw_u "
        f"ORDER BY dbw_o0 DESC, dbw_o1 LIMIT {KEYS}"
    )


def test_a_fenced_pick_of_rows_named_by_key_goes_by_the_primary_key():
    """Through the state index a pick locked a row's index entry and then waited for
    the row another transaction held (SKIP LOCKED did not skip it there), and the
    worker's other picks waited on that entry: its heartbeats stopped
    (tests/chaos/test_locks.py on MariaDB)."""
    from django_dbworker.sql.mysql import MySQLDialect

    by_key = MySQLDialect().fenced("`t`", "`id`", "`id` = %(pk)s AND `state` = 'processing'")
    assert by_key == (
        f"`id` IN (SELECT `id` FROM `t` {PRIMARY} WHERE `id` = %(pk)s AND "
        "`state` = 'processing' FOR UPDATE SKIP LOCKED)"
    )
    by_state = MySQLDialect().fenced("`t`", "`id`", "`state` = 'processing'")
    assert PRIMARY not in by_state
