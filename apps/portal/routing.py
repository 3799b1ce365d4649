from django.urls import path, re_path

from .consumers import JobConsumer, NoSuchSocket

websocket_urlpatterns = [
    path("ws/jobs/<any_uuid:job_id>/", JobConsumer.as_asgi()),
    re_path(r"", NoSuchSocket.as_asgi()),  # last: anything else is refused 4404, not a 500
]
