"""A Pulsar program moved to raydelay: only the import line changed.

It schedules order timeouts ("cancel the order in 30 minutes unless it was paid", here
2 seconds), consumes them on a Key_Shared subscription (each order's events in order, on
one consumer), retries a failed one with a negative ack, and sends what keeps failing to
a dead-letter topic. Run it with ``python examples/pulsar_migration.py``: it starts the
embedded raydelay (a local Ray and a local-dir store under ./.raydelay), or attaches to
$RAYDELAY_ADDRESS.
"""

from datetime import timedelta

# import pulsar                             # before
import raydelay.compat.pulsar as pulsar  # after: the only line that changed

client = pulsar.Client("pulsar://localhost:6650")
consumer = client.subscribe(
    "persistent://public/default/order-timeouts",
    "billing",
    consumer_type=pulsar.ConsumerType.KeyShared,
    negative_ack_redelivery_delay_ms=200,
    dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
        max_redeliver_count=2,
        dead_letter_topic="order-timeouts-dlq",
        initial_subscription_name="ops",
    ),
)
producer = client.create_producer(
    "persistent://public/default/order-timeouts", producer_name="shop"
)
for order in range(5):
    producer.send(
        b"timeout order-%d" % order,
        partition_key=f"order-{order}",
        properties={"reason": "unpaid"},
        deliver_after=timedelta(seconds=2),
    )

handled, failures = [], 0
while True:
    try:  # the first wait covers the 2 s delay; then 3 s of quiet ends the loop
        msg = consumer.receive(timeout_millis=10_000 if not handled else 3_000)
    except pulsar.Timeout:
        break
    if msg.partition_key() == "order-3":  # this one's handler keeps failing
        failures += 1
        consumer.negative_acknowledge(msg)
        continue
    handled.append(msg.data().decode())
    consumer.acknowledge(msg)

dlq = client.subscribe("order-timeouts-dlq", "ops", consumer_type=pulsar.ConsumerType.Shared)
dead = dlq.receive(timeout_millis=10_000)
dlq.acknowledge(dead)
print(f"handled {len(handled)} timeouts, order-3 failed {failures} times and went to the DLQ:")
print(f"  {dead.data().decode()} (from {dead.properties().get('raydelay.subscription')})")
client.close()
