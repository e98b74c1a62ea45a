"""The consumer of the benchmark's ``consumers`` part: follows BenchEvent, does nothing."""

from django_dbworker.consumers import Consumer

from .models import BenchEvent


class TrivialConsumer(Consumer):
    name = "bench_trivial"
    model = BenchEvent
    batch_size = 100
    gap_threshold = 5.0

    def handle_batch(self, events):
        pass
