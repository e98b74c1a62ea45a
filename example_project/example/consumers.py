"""An outbox relay: publishes committed outbox rows in order (at least once)."""

import logging

from django_dbworker.consumers import Consumer

from .models import OutboxMessage

logger = logging.getLogger(__name__)


class OutboxRelay(Consumer):
    name = "outbox_relay_v1"
    model = OutboxMessage
    batch_size = 100
    # Publishing leaves the database: at least once; subscribers dedupe by message id,
    # and can refuse a generation lower than one they have seen (the fencing token).
    transactional = False

    def handle_batch(self, rows):
        generation = self.batch.generation
        for message in rows:
            logger.info("publish %s %s (generation %d)", message.topic, message.pk, generation)
