from django.contrib import admin
from django.urls import include, path
from django_rq import urls as django_rq_urls
from drf_spectacular.views import SpectacularAPIView

from apps.accounts import api as accounts_api
from apps.accounts.views import ThrottledLoginView, login_throttled
from apps.cluster.api import ClusterView
from apps.core.admin_scoping import superuser_only_patterns
from apps.datasets import api as datasets_api
from apps.jobs import api as jobs_api
from apps.jobs import attempts_api
from apps.monitoring.views import prometheus_metrics
from apps.notifications import api as notifications_api
from apps.portal.admin import RQ_SUPERUSERS_ONLY
from apps.portal.views import sign_out
from apps.quotas.api import UsageView
from apps.registry import api as registry_api
from apps.scheduling import api as scheduling_api
from apps.sweeps import api as sweeps_api

api_v1 = [
    path("jobs/", jobs_api.JobListCreate.as_view(), name="api-jobs"),
    path("jobs/<any_uuid:job_id>/", jobs_api.JobDetail.as_view(), name="api-job"),
    path("jobs/<any_uuid:job_id>/cancel/", jobs_api.JobCancel.as_view(), name="api-job-cancel"),
    path("jobs/<any_uuid:job_id>/requeue/", jobs_api.JobRequeue.as_view(), name="api-job-requeue"),
    path("jobs/<any_uuid:job_id>/continue/", jobs_api.JobContinue.as_view(), name="api-job-continue"),
    path("jobs/<any_uuid:job_id>/class/", jobs_api.JobClass.as_view(), name="api-job-class"),
    path("jobs/<any_uuid:job_id>/metrics/", jobs_api.JobMetrics.as_view(), name="api-job-metrics"),
    path("jobs/<any_uuid:job_id>/logs/", jobs_api.JobLogs.as_view(), name="api-job-logs"),
    path("jobs/<any_uuid:job_id>/events/", jobs_api.JobEvents.as_view(), name="api-job-events"),
    path("jobs/<any_uuid:job_id>/weights/", jobs_api.JobWeights.as_view(), name="api-job-weights"),
    path("jobs/<any_uuid:job_id>/sweep/", sweeps_api.SweepDetail.as_view(), name="api-job-sweep"),
    path("queue/", jobs_api.QueueList.as_view(), name="api-queue"),
    path("attempts/<any_uuid:attempt_id>/report/", attempts_api.AttemptReport.as_view(), name="api-attempt-report"),
    path("cluster/", ClusterView.as_view(), name="api-cluster"),
    path("usage/", UsageView.as_view(), name="api-usage"),
    path("teams/", scheduling_api.TeamList.as_view(), name="api-teams"),
    path("teams/<int:pk>/", scheduling_api.TeamDetail.as_view(), name="api-team"),
    path("models/", registry_api.ModelListView.as_view(), name="api-models"),
    path("models/<int:pk>/", registry_api.ModelDetailView.as_view(), name="api-model"),
    path("models/<int:pk>/download/", registry_api.ModelDownloadView.as_view(), name="api-model-download"),
    path("models/<int:pk>/stage/", registry_api.ModelStageView.as_view(), name="api-model-stage"),
    path("exports/<int:pk>/download/", registry_api.ExportDownloadView.as_view(), name="api-export-download"),
    path("weights/", registry_api.WeightsUploadView.as_view(), name="api-weights"),
    path("jobs/<any_uuid:job_id>/predictions/", registry_api.PredictionsView.as_view(), name="api-job-predictions"),
    path("jobs/<any_uuid:job_id>/predictions/<int:index>/image/", registry_api.PredictionImageView.as_view(),
         name="api-job-prediction-image"),
    path("datasets/", datasets_api.DatasetListCreate.as_view(), name="api-datasets"),
    path("datasets/<int:pk>/", datasets_api.DatasetDetail.as_view(), name="api-dataset"),
    path("datasets/<int:pk>/samples/<int:index>/", datasets_api.DatasetSample.as_view(), name="api-dataset-sample"),
    path("tokens/", accounts_api.TokenListCreate.as_view(), name="api-tokens"),
    path("tokens/<int:token_id>/", accounts_api.TokenDetail.as_view(), name="api-token"),
    path("audit/", accounts_api.AuditList.as_view(), name="api-audit"),
    path("notifications/channels/", notifications_api.ChannelListCreate.as_view(), name="api-notification-channels"),
    path("notifications/channels/<int:channel_id>/", notifications_api.ChannelDetail.as_view(),
         name="api-notification-channel"),
    path("notifications/channels/<int:channel_id>/test/", notifications_api.ChannelTest.as_view(),
         name="api-notification-channel-test"),
    path("notifications/preferences/", notifications_api.PreferenceView.as_view(), name="api-notification-preferences"),
    path("notifications/deliveries/", notifications_api.DeliveryList.as_view(), name="api-notification-deliveries"),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
]

urlpatterns = [
    # The RQ dashboard shows every team's queue entries: superusers only (managers are staff).
    path("admin/rq/", include((superuser_only_patterns(django_rq_urls.urlpatterns, why=RQ_SUPERUSERS_ONLY),
                               "django_rq"))),
    # The admin's sign-in page shares the portal's login throttle (429), before admin's own URLs.
    path("admin/login/", login_throttled(admin.site.login), name="admin-login"),
    path("admin/", admin.site.urls),
    path("accounts/logout/", sign_out, name="logout"),
    path("accounts/login/", ThrottledLoginView.as_view(), name="login"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", include(api_v1)),
    path("metrics", prometheus_metrics, name="metrics"),
    path("", include("apps.portal.urls")),
]

# JSON 404s under /api/ (e.g. a malformed id in the path); the usual page elsewhere.
handler404 = "apps.core.api.not_found"
