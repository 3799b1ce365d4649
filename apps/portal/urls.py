from django.urls import path

from apps.notifications import views as notification_views

from . import lifecycle, views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("dashboard/live/", views.dashboard_live, name="dashboard-live"),
    path("jobs/", views.jobs, name="jobs"),
    path("jobs/new/", views.job_new, name="job-new"),
    path("jobs/<any_uuid:job_id>/", views.job_detail, name="job"),
    path("jobs/<any_uuid:job_id>/outcome/", views.job_outcome_view, name="job-outcome"),
    path("jobs/<any_uuid:job_id>/cancel/", views.job_cancel_view, name="job-cancel"),
    path("jobs/<any_uuid:job_id>/resubmit/", views.job_resubmit, name="job-resubmit"),
    path("jobs/<any_uuid:job_id>/continue/", views.job_continue_view, name="job-continue"),
    path("jobs/<any_uuid:job_id>/requeue/", views.job_requeue_view, name="job-requeue"),
    path("jobs/<any_uuid:job_id>/class/", views.job_class_view, name="job-class"),
    path("usage/", views.usage, name="usage"),
    path("teams/", views.teams, name="teams"),
    path("teams/<int:pk>/", views.teams, name="team"),
    path("models/", views.models, name="models"),
    path("models/compare/", lifecycle.models_compare, name="models-compare"),
    path("models/<int:pk>/", lifecycle.model_detail, name="model"),
    path("models/<int:pk>/stage/", lifecycle.model_stage, name="model-stage"),
    path("datasets/", lifecycle.datasets, name="datasets"),
    path("datasets/<int:pk>/", lifecycle.dataset_detail, name="dataset"),
    path("datasets/<int:pk>/delete/", lifecycle.dataset_delete_view, name="dataset-delete"),
    path("weights/", lifecycle.weights, name="weights"),
    path("jobs/<any_uuid:job_id>/predictions/", lifecycle.predictions, name="job-predictions"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:pk>/revoke/", views.token_revoke_view, name="token-revoke"),
    path("notifications/", notification_views.notifications, name="notifications"),
    path("notifications/channels/<int:pk>/delete/", notification_views.channel_delete_view,
         name="notification-channel-delete"),
    path("notifications/channels/<int:pk>/enable/", notification_views.channel_enable_view,
         name="notification-channel-enable"),
    path("notifications/channels/<int:pk>/test/", notification_views.channel_test_view,
         name="notification-channel-test"),
]
