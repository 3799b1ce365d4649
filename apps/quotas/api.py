from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from .selectors import usage_summary


# Schema only: the view returns usage_summary's dict (a docstring here would show in the schema).
class UsageOut(serializers.Serializer):
    user = serializers.CharField()
    me = serializers.DictField()
    teams = serializers.DictField(child=serializers.DictField())


class UsageView(APIView):
    @extend_schema(responses=UsageOut)
    def get(self, request):
        return Response(usage_summary(user=request.user))
