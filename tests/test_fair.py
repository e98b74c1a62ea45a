"""Fair claims across tenants (issue 43, item 2): the claim statement against the real
database, then real workers. The same tests on SQLite, PostgreSQL and MariaDB."""

from collections import Counter

import pytest

from tests.testapp import handlers as h
from tests.testapp.models import TenantJob

from .test_limits import claims, finish, tenants  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db(transaction=True)


def backlog(*sizes, tenant0=1):
    """Jobs of tenants 1, 2, … (``sizes`` each), each tenant's after the previous."""
    for i, size in enumerate(sizes):
        TenantJob.objects.bulk_create(TenantJob(tenant=tenant0 + i) for _ in range(size))


def test_a_tenant_behind_a_backlog_gets_its_share_of_the_first_claim(claims):
    backlog(200, 3, 3)
    taken = claims(h.FairHandler())(6)
    assert Counter(tenants(taken)) == {1: 2, 2: 2, 3: 2}


def test_each_tenants_jobs_come_in_ordering(claims):
    backlog(20, 20)
    claim = claims(h.FairHandler())
    seen = []
    for _ in range(5):
        jobs = claim(4)
        seen += jobs
        finish(*jobs)
    for tenant in (1, 2):
        mine = [j.pk for j in seen if j.tenant == tenant]
        assert mine == sorted(mine)
        assert mine == list(
            TenantJob.objects.filter(tenant=tenant).order_by("pk").values_list("pk", flat=True)[
                : len(mine)
            ]
        )
