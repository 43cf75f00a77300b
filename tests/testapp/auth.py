"""A header authentication for tests: ``X-User: alice`` (no database hit)."""

from dataclasses import dataclass

from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import AuthenticationFailed


@dataclass(frozen=True)
class User:
    pk: int
    username: str
    tenant_id: int | None
    is_authenticated: bool = True
    is_active: bool = True


USERS = {
    "alice": User(1, "alice", 1),
    "amy": User(2, "amy", 1),  # alice's colleague at tenant 1
    "bob": User(3, "bob", 2),
    "nobody": User(4, "nobody", None),  # authenticated, but belongs to no tenant
}


class HeaderAuthentication(BaseAuthentication):
    def authenticate(self, request):
        name = request.META.get("HTTP_X_USER")
        if name is None:
            return None
        try:
            return USERS[name], None
        except KeyError:
            raise AuthenticationFailed("unknown user") from None

    def authenticate_header(self, request):
        return "X-User"


def tenant_of(request):
    return getattr(request.user, "tenant_id", None)
