import gc
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

# What the process made to get here (Django, the apps, URL and serializer tables) lives as long as
# the process: frozen, the cyclic collector no longer walks it, and the youngest generation is
# collected every 10,000 new containers instead of 700. Under the submit bench the collector's
# CPU per submit fell from ~0.2 to ~0.085 ms, in 17 collections of ~6 ms per 1,200 submits
# instead of 260 (docs/performance.md, "Where a submit's time went", item 22).
gc.collect()
gc.freeze()
gc.set_threshold(10_000, 10, 10)

application = ProtocolTypeRouter(
    {
        "http": BodyLimitMiddleware(http_app),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
