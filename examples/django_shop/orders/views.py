import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from foundry.integrations.django import submit_on_commit
from orders.models import Order
from orders.tasks import send_confirmation


class PaymentDeclined(Exception):
    pass


@csrf_exempt
@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    try:
        with transaction.atomic():
            order = Order.objects.create(email=body["email"])
            # enqueued only if this block commits; the key makes a repeated submit harmless
            submit_on_commit(send_confirmation.options(key=f"confirm-{order.id}"), order.id)
            if body.get("declined"):
                raise PaymentDeclined(order.id)  # rolls the order back: no confirmation is sent
    except PaymentDeclined:
        return JsonResponse({"error": "payment declined"}, status=402)
    return JsonResponse({"order": order.id}, status=201)
