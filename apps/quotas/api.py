from __future__ import annotations

from rest_framework.response import Response
from rest_framework.views import APIView

from .selectors import usage_summary


class UsageView(APIView):
    def get(self, request):
        return Response(usage_summary(user=request.user))
