import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "yoloportal.settings")
application = get_wsgi_application()

from apps.core.redis_outage import WEB_CONSEQUENCE, redis_outage_consequence  # noqa: E402

# A web process's one WARNING of a Redis outage says what still works, as under ASGI (asgi.py).
redis_outage_consequence(WEB_CONSEQUENCE)
