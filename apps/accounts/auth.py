from __future__ import annotations

from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header

from apps.core.prepared import PreparedRead

from .models import ApiToken, hash_token

# Every API request: compiled once per connection (apps/core/prepared.py).
TOKEN_BY_HASH = PreparedRead(lambda key_hash: ApiToken.objects.select_related("user").filter(key_hash=key_hash)[:1],
                             samples=({"key_hash": "0" * 64}, {"key_hash": "1" * 64}))


class HashedTokenAuthentication(BaseAuthentication):
    """``Authorization: Token <key>`` against hashed, expiring, revocable tokens."""

    keyword = "Token"

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if parts and parts[0].lower() == b"bearer":
            # What most CI tools send by default; it read "Authentication credentials were not
            # provided", though they were, in another scheme (CI trial 17, H10).
            raise exceptions.AuthenticationFailed("Authorization header: this API takes 'Token <key>', not 'Bearer <key>'.")
        if not parts or parts[0].lower() != self.keyword.lower().encode():
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Authorization header: expected 'Token <key>'.")
        try:
            key = parts[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed("Authorization header: token is not valid text.") from None
        return self.authenticate_key(key)

    def authenticate_key(self, key: str):
        token = next(iter(TOKEN_BY_HASH(key_hash=hash_token(key))), None)
        if token is None or not token.is_active or not token.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        now = timezone.now()
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request) -> str:
        return self.keyword
