"""The durable work of the orders app, declared on the project's Foundry app (the
``AppConfig`` of ``foundry.integrations.django`` imports this module in every process)."""

from foundry.integrations.django import get_app
from orders.models import Order

app = get_app()


@app.work(durable=True, retries=3)
def send_confirmation(order_id: int) -> str:
    # Runs in a worker after the order's transaction committed: the row is there to read.
    order = Order.objects.get(pk=order_id)
    Order.objects.filter(pk=order_id).update(confirmed=True)
    return f"confirmation sent to {order.email}"
