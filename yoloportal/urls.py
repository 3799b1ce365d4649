from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from apps.cluster.api import ClusterView
from apps.jobs import api as jobs_api
from apps.portal.metrics import prometheus_metrics
from apps.quotas.api import UsageView
from apps.registry import api as registry_api

api_v1 = [
    path("jobs/", jobs_api.JobListCreate.as_view(), name="api-jobs"),
    path("jobs/<uuid:job_id>/", jobs_api.JobDetail.as_view(), name="api-job"),
    path("jobs/<uuid:job_id>/cancel/", jobs_api.JobCancel.as_view(), name="api-job-cancel"),
    path("jobs/<uuid:job_id>/metrics/", jobs_api.JobMetrics.as_view(), name="api-job-metrics"),
    path("jobs/<uuid:job_id>/logs/", jobs_api.JobLogs.as_view(), name="api-job-logs"),
    path("jobs/<uuid:job_id>/events/", jobs_api.JobEvents.as_view(), name="api-job-events"),
    path("jobs/<uuid:job_id>/weights/", jobs_api.JobWeights.as_view(), name="api-job-weights"),
    path("queue/", jobs_api.QueueList.as_view(), name="api-queue"),
    path("cluster/", ClusterView.as_view(), name="api-cluster"),
    path("usage/", UsageView.as_view(), name="api-usage"),
    path("models/", registry_api.ModelListView.as_view(), name="api-models"),
    path("models/<int:pk>/", registry_api.ModelDetailView.as_view(), name="api-model"),
    path("models/<int:pk>/download/", registry_api.ModelDownloadView.as_view(), name="api-model-download"),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
]

urlpatterns = [
    path("admin/rq/", include("django_rq.urls")),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", include(api_v1)),
    path("metrics", prometheus_metrics, name="metrics"),
    path("", include("apps.portal.urls")),
]
