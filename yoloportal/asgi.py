import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "yoloportal.settings")

from yoloportal.asgi_threads import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from apps.core.redis_outage import WEB_CONSEQUENCE, redis_outage_consequence  # noqa: E402
from apps.portal.routing import websocket_urlpatterns  # noqa: E402
from yoloportal.body_limit import BodyLimitMiddleware, install_daphne_body_limit  # noqa: E402

# Oversized request bodies: 413 before they are read (docs/security.md). Daphne receives a
# body before calling the app, so it gets the check too; other ASGI servers need only the
# middleware.
install_daphne_body_limit()
# A web process's one WARNING of a Redis outage says what still works (apps/core/redis_outage.py).
redis_outage_consequence(WEB_CONSEQUENCE)
http_app = ASGIStaticFilesHandler(django_asgi_app) if settings.SERVE_STATIC else django_asgi_app

application = ProtocolTypeRouter(
    {
        "http": BodyLimitMiddleware(http_app),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
