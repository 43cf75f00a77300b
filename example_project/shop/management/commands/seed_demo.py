"""Create the demo's two merchants, their users (with API tokens) and products."""

import hashlib
import json

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token

from tenancy import tenant_context

from ...models import Membership, Merchant, Product

MERCHANTS = {
    "Acme Tea": {
        "user": "alice",
        "products": [("TEA-GREEN", "Green tea", 450, 100), ("TEA-BLACK", "Black tea", 400, 100)],
    },
    "Bolt Coffee": {"user": "bob", "products": [("COF-BEANS", "Coffee beans", 1200, 50)]},
}


def demo_token(username: str) -> str:
    return hashlib.sha1(f"demo-token-{username}".encode()).hexdigest()


class Command(BaseCommand):
    help = "Create (or reset) the demo merchants, users, tokens and stock; print them as JSON."

    def handle(self, *args, **options):
        out = {}
        for name, spec in MERCHANTS.items():
            merchant, _ = Merchant.objects.get_or_create(name=name)
            user, _ = User.objects.get_or_create(
                username=spec["user"], defaults={"email": f"{spec['user']}@example.com"}
            )
            Membership.objects.update_or_create(user=user, defaults={"merchant": merchant})
            Token.objects.filter(user=user).delete()
            token = Token.objects.create(user=user, key=demo_token(user.username))
            with tenant_context(merchant.pk):
                for sku, title, price, stock in spec["products"]:
                    Product.objects.update_or_create(
                        tenant_id=merchant.pk,
                        sku=sku,
                        defaults={"name": title, "price_cents": price, "stock": stock},
                    )
            out[user.username] = {"merchant": merchant.pk, "name": name, "token": token.key}
        self.stdout.write(json.dumps(out))
