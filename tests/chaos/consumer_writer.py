"""A writer process of the consumer gap test: inserts events in transactions of random
length, rolls some back, and prints ``commit <id>`` / ``rollback <id>`` per row."""

import os
import random
import sys
import time

import django


class Rollback(Exception):
    pass


def main(count: int, seed: int, hold_max: float) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    from django.db import transaction

    from tests.testapp.models import OrderEvent

    rng = random.Random(seed)
    written = 0
    out = sys.stdout
    while written < count:
        n = rng.randint(1, 3)
        ids = []
        try:
            with transaction.atomic():
                for _ in range(n):
                    kind = "Order" if rng.random() < 0.5 else "Other"
                    ids.append(OrderEvent.objects.create(aggregate_type=kind, writer=seed).pk)
                roll = rng.random()
                if roll < 0.03:
                    time.sleep(rng.uniform(0.2, hold_max))  # held open
                elif roll < 0.3:
                    time.sleep(rng.uniform(0, 0.01))
                if rng.random() < 0.08:
                    raise Rollback
            out.write("".join(f"commit {i}\n" for i in ids))
        except Rollback:
            out.write("".join(f"rollback {i}\n" for i in ids))
        written += n
    out.flush()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
