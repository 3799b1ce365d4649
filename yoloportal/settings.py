"""yoloportal settings: everything comes from environment variables (see README)."""

from __future__ import annotations

import os
import zoneinfo
from pathlib import Path

from redis.connection import parse_url as redis_parse_url

from yoloportal.env import (
    EnvError,
    checkout_tag,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_path,
    env_rate,
    env_str,
    parse_database_url,
    shown_url,
)
from yoloportal.logs import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent
# Under pytest (which sets PYTEST_VERSION, inherited by the processes tests start) the
# default data folder is var/test, so a test run never touches `make run`'s data; under
# pytest-xdist (`make test` runs two workers) var/test/gw0, var/test/gw1: each worker has its
# own test database, storage and job folders (PYTEST_XDIST_WORKER is inherited too). A run
# given a test database of its own (TEST_DATABASE_PATH or TEST_DATABASE_NAME: runs side by side
# in one checkout) gets folders of its own too, var/test/<database>/gwN: sharing them, one run's
# clean_storage emptied the job folders under the other's tests (a continue's checkpoint copy
# found its file gone). Named after the database the run uses: with both variables set, TEST_DATABASE_NAME
# on PostgreSQL, TEST_DATABASE_PATH on SQLite (a PostgreSQL run was named after the unused file).
_TEST_SQLITE = Path(os.environ.get("TEST_DATABASE_PATH") or "").stem
_TEST_POSTGRES = os.environ.get("TEST_DATABASE_NAME") or ""
if (os.environ.get("DATABASE_URL") or "sqlite:").startswith("sqlite:"):
    _TEST_RUN = _TEST_SQLITE or _TEST_POSTGRES
else:
    _TEST_RUN = _TEST_POSTGRES or _TEST_SQLITE
DATA_DIR = env_path("DATA_DIR", BASE_DIR / "var" / (
    str(Path("test", _TEST_RUN, os.environ.get("PYTEST_XDIST_WORKER", ""))) if os.environ.get("PYTEST_VERSION")
    else ""))

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY")
# What this process made to hold a generated SECRET_KEY (the file, the folders made for it): a
# refused `manage.py restore` takes them back (apps/core/backup.py).
SECRET_KEY_MADE: tuple[Path, ...] = ()
if not SECRET_KEY:
    # One machine: a key generated once and kept under DATA_DIR, so sessions survive restarts.
    from yoloportal.secret import load_or_create_secret_key

    SECRET_KEY, SECRET_KEY_MADE = load_or_create_secret_key(DATA_DIR / "secret_key")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "apps.accounts.admin_apps.AuditedAdminConfig",  # django.contrib.admin, every change audited
    "apps.core",  # before django.contrib.auth: its changepassword replaces auth's (apps/core/management)
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "channels",
    "django_rq",
    "apps.accounts",
    "apps.cluster",
    "apps.datasets",
    "apps.jobs",
    "apps.quotas",
    "apps.registry",
    "apps.scheduling",
    "apps.portal",
    "apps.monitoring",
    "apps.notifications",
    "apps.sweeps",
    "worker",  # its management commands: gpu_worker, slurm_agent
]

MIDDLEWARE = [
    "apps.core.health.HealthMiddleware",  # /healthz, /readyz: before the host check and HTTPS redirect
    "apps.monitoring.middleware.RequestIdMiddleware",
    "apps.core.middleware.QueryNulMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "yoloportal.urls"
WSGI_APPLICATION = "yoloportal.wsgi.application"
ASGI_APPLICATION = "yoloportal.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = env_str("DATABASE_URL") or f"sqlite:///{DATA_DIR / 'yoloportal.sqlite3'}"
# PostgreSQL: the hot statements (apps/core/prepared.py) are prepared on the server; false
# behind a pooler that cannot keep prepared statements (yoloportal/env.py, docs/deploy.md).
DATABASE_PREPARED_STATEMENTS = env_bool("DATABASE_PREPARED_STATEMENTS", True)
DATABASES = {"default": parse_database_url(DATABASE_URL, prepared_statements=DATABASE_PREPARED_STATEMENTS)}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # A file, not :memory:, so test subprocesses (scheduler, worker, web) share it.
    DATABASES["default"]["TEST"] = {"NAME": env_str("TEST_DATABASE_PATH") or str(DATA_DIR / "test.sqlite3")}
else:
    # One PostgreSQL serves every checkout on a machine (CI, several worktrees): each
    # checkout gets its own test database, named after its folder.
    DATABASES["default"]["TEST"] = {
        "NAME": env_str("TEST_DATABASE_NAME") or f"test_{DATABASES['default']['NAME']}_{checkout_tag(BASE_DIR)}"
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
# Django's own refusal ("Incorrect timezone setting: Mars/Base") named no variable.
try:
    zoneinfo.ZoneInfo(TIME_ZONE)
except (zoneinfo.ZoneInfoNotFoundError, ValueError):
    raise EnvError(f"TIME_ZONE={TIME_ZONE!r} is not a time zone: use an IANA name such as Europe/Berlin") from None
USE_I18N = False
# One 24-hour clock with its zone on pages and in admin (yoloportal/formats/en/formats.py).
FORMAT_MODULE_PATH = ["yoloportal.formats"]
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "staticfiles"
# The ASGI app serves /static/ itself (ASGIStaticFilesHandler, yoloportal/asgi.py; no collectstatic step);
# turn off behind a proxy that does.
SERVE_STATIC = env_bool("SERVE_STATIC", True)
# Threads per web process that run Django's synchronous code, each keeping its database
# connection between requests (yoloportal/asgi_threads.py). Processes: WEB_WORKERS (Procfile).
WEB_THREADS = env_int("WEB_THREADS", 4, minimum=1, maximum=64)

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"
# apps/core (admin team scoping) names the team model and the "teams this user manages" read
# here instead of importing an app, as AUTH_USER_MODEL does for users.
TEAM_MODEL = "accounts.Team"
MANAGED_TEAM_IDS = "apps.accounts.selectors.managed_team_ids"

# --- Redis: RQ delivery, channel layer, scheduler kicks ------------------------------
EMBEDDED_REDIS_PORT = env_int("EMBEDDED_REDIS_PORT", 6390, minimum=1, maximum=65535)
REDIS_URL = env_str("REDIS_URL") or f"redis://127.0.0.1:{EMBEDDED_REDIS_PORT}/0"
# redis-py reads it only at the first connection: REDIS_URL=notaurl passed `manage.py check`, then every
# process stopped with "Redis URL must specify one of the following schemes", naming no variable.
try:
    redis_parse_url(REDIS_URL)
except ValueError as refused:
    raise EnvError(f"REDIS_URL={shown_url(REDIS_URL)!r} is not a Redis URL: {refused}") from None
RQ_QUEUES = {"default": {"URL": REDIS_URL, "DEFAULT_TIMEOUT": 3600}}
RQ_SHOW_ADMIN_LINK = True

# The shared cache: throttle and login counters every web process sees (docs/security.md).
CACHES = {
    "default": {
        "BACKEND": "apps.core.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "yoloportal",
        "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2},
    }
}

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # redis-py ≥ 6 reads with a 5 s socket timeout by default, and channels-redis blocks
        # 5 s in BZPOPMIN: an idle socket's consumer then dies with TimeoutError. Read longer.
        "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30}], "capacity": 1000, "expiry": 30},
    }
}

# --- REST API ---------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.accounts.auth.HashedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # DRF's two, the JSON one escaping lone surrogates stored before they were refused (apps.core.api).
    "DEFAULT_RENDERER_CLASSES": [
        "apps.core.api.EscapingJSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    # DRF's three, the JSON one refusing lone surrogates ("\ud800": text no answer can hold).
    "DEFAULT_PARSER_CLASSES": [
        "apps.core.api.StrictJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "apps.core.pagination.ListPage",
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "apps.core.api.exception_handler",
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "apps.core.api.FormatNamedNegotiation",
    # Counted in the shared cache (Redis, CACHES below), so they hold across web processes.
    "DEFAULT_THROTTLE_RATES": {
        "submit": env_rate("THROTTLE_SUBMIT", "120/min"),
        # New versions stored per user (refused and unchanged uploads count apart, at 5×: throttles.py).
        # Disk is bounded by TEAM_STORAGE_QUOTA_GB and each body by *_UPLOAD_MAX_BYTES; this only stops
        # a flood, so it leaves room to iterate on a dataset (20/hour was hit fixing labels in a loop).
        "upload": env_rate("THROTTLE_UPLOAD", "60/hour"),
        "auth": env_rate("THROTTLE_AUTH", "20/min"),
        "login": env_rate("THROTTLE_LOGIN", "10/min"),
        "channel_test": env_rate("THROTTLE_CHANNEL_TEST", "10/min"),
    },
}
SPECTACULAR_SETTINGS = {
    "TITLE": "yoloportal API",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # A job's id in a path, in either case (apps.core.converters): a UUID, as Django's own <uuid:>.
    "PATH_CONVERTER_OVERRIDES": {"any_uuid": {"type": "string", "format": "uuid"}},
    # priority_class and run_class share one choice set: one enum in the schema.
    "ENUM_NAME_OVERRIDES": {"PriorityClassEnum": "apps.jobs.models.PriorityClass", "JobStateEnum": "apps.jobs.models.JobState",
                            "ChannelKindEnum": "apps.notifications.models.Channel.Kind",
                            "DatasetKindEnum": "apps.datasets.models.Dataset.Kind",
                            "ModelSourceEnum": "apps.registry.models.ModelVersion.Source",
                            "ModelStageEnum": "apps.registry.models.Stage"},
    # Every paged list's ?limit= and ?offset= in the schema (apps.core.openapi.page_parameters);
    # every GET's 400 for a parameter it does not take (apps.core.openapi.query_errors).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "apps.core.openapi.page_parameters",
                             "apps.core.openapi.query_errors", "apps.core.openapi.retry_after"],
}

# --- Scheduler and workers ----------------------------------------------------------------
SCHEDULER_TICK_S = env_float("SCHEDULER_TICK_S", 3.0, minimum=0.1)
# How long a web process may reuse what submit's admission reads (nodes, quotas, scheduler
# configuration; apps/scheduling/admission.py). Changes made in the same process apply at once.
ADMISSION_CACHE_S = env_float("ADMISSION_CACHE_S", 2.0, minimum=0.0)
NODE_GRACE_S = env_float("NODE_GRACE_S", 30.0, minimum=1.0)
HEARTBEAT_S = env_float("HEARTBEAT_S", 5.0, minimum=0.2)
# A node silent this long (three missed heartbeats; never more than the grace) is suspected:
# it gets no new work, and the lost-node reaper alone decides about the attempts on it.
NODE_SUSPECT_S = env_float("NODE_SUSPECT_S", 3 * HEARTBEAT_S, minimum=0.2)
DISPATCH_REPAIR_S = env_float("DISPATCH_REPAIR_S", 20.0, minimum=1.0)
# A job fails, instead of being requeued, once this many of its started attempts ended
# without their worker reporting (node lost, monitor silent): a job that kills whatever runs
# it cannot loop forever (apps.jobs.services.attempt_lost).
MAX_LOST_ATTEMPTS = env_int("MAX_LOST_ATTEMPTS", 5, minimum=1)
# An open job WebSocket re-checks that its user may still see the job this often (seconds).
WS_ACCESS_RECHECK_S = env_float("WS_ACCESS_RECHECK_S", 5.0, minimum=0.5)
# Stored log text per job (all attempts); past it one notice is stored and the rest dropped.
JOB_LOG_MAX_BYTES = env_int("JOB_LOG_MAX_BYTES", 20 * 1024**2, minimum=1024)
# Hot/cold logs (apps/jobs/log_archive.py): the logs of jobs finished more than LOG_HOT_DAYS
# ago move from the database into the artifact storage (gzip), read back transparently; the
# scheduler does it every LOG_ARCHIVE_EVERY_S. Logs (archived or not) are deleted only when
# LOG_RETENTION_DAYS (0 = keep forever) says so; it may be shorter than LOG_HOT_DAYS.
LOG_HOT_DAYS = env_float("LOG_HOT_DAYS", 30.0, minimum=0.0)
LOG_RETENTION_DAYS = env_float("LOG_RETENTION_DAYS", 0.0, minimum=0.0)
LOG_ARCHIVE_EVERY_S = env_float("LOG_ARCHIVE_EVERY_S", 3600.0, minimum=1.0)
# Resume checkpoints of ended jobs (apps/jobs/checkpoint_retention.py, on the same housekeeping
# run): a succeeded job's leave the artifact store at once (its weights stay); a failed,
# cancelled or timed-out job's this many days after it ended (0 = keep them forever).
CHECKPOINT_RETENTION_DAYS = env_float("CHECKPOINT_RETENTION_DAYS", 0.0, minimum=0.0)
SPEC_MAX_BYTES = env_int("SPEC_MAX_BYTES", 64 * 1024, minimum=1024)
# Any other request body (yoloportal/body_limit.py has the per-path limits); Django's own
# form limit is the same 2.5 MiB.
REQUEST_MAX_BYTES = env_int("REQUEST_MAX_BYTES", 2_621_440, minimum=1024)
# Queued + starting + running jobs one user may have at once (429 beyond it).
MAX_ACTIVE_JOBS_PER_USER = env_int("MAX_ACTIVE_JOBS_PER_USER", 100, minimum=1)
DEFAULT_JOB_TIMEOUT_S = env_int("DEFAULT_JOB_TIMEOUT_S", 24 * 3600, minimum=60)
MAX_JOB_TIMEOUT_S = env_int("MAX_JOB_TIMEOUT_S", 7 * 24 * 3600, minimum=60)
# A training's shortest timeout: its process starts and loads the model first, so 0.0001 hours on the
# portal form (a 1-second job) only ever timed out (trial23). Val, predict and export keep 1 s.
MIN_TRAIN_TIMEOUT_S = env_int("MIN_TRAIN_TIMEOUT_S", 60, minimum=1)
# Fork training children from a preloaded interpreter (worker/zygote.py): "auto" (= true) uses it
# on every node since it was verified on an NVIDIA H200 (docs/gpu-check.md); false starts a fresh
# interpreter per job.
TRAINER_PRELOAD = env_str("TRAINER_PRELOAD", "auto").lower()
if TRAINER_PRELOAD not in {"auto", "true", "false", "1", "0"}:
    raise EnvError(f"TRAINER_PRELOAD={TRAINER_PRELOAD!r} must be auto, true or false")
# Training arguments that would take what a node shares with other jobs (docs/security.md).
TRAIN_MAX_WORKERS = env_int("TRAIN_MAX_WORKERS", 8, minimum=0)
TRAIN_MAX_SAVED_EPOCHS = env_int("TRAIN_MAX_SAVED_EPOCHS", 20, minimum=0)
# --- Executors (worker/executors/, docs/executors.md) -------------------------------------
# The names this worker's own environment answers to in a job's `image:`; a job is placed
# only on a node that has its image (an empty `image:` runs anywhere).
NODE_IMAGES = env_list("NODE_IMAGES", ["ultralytics/yolov8:latest", "local"])
# Each attempt in its own cgroup with its memory/CPU/pids limits, where the host allows it.
ATTEMPT_CGROUPS = env_bool("ATTEMPT_CGROUPS", True)
ATTEMPT_PIDS_MAX = env_int("ATTEMPT_PIDS_MAX", 4096, minimum=16)
# How a gpu_worker runs attempts: "local" (a process group) or "container" (CONTAINER_RUNTIME
# run of the job's image, with NODE_IMAGES then naming the images present on the node).
WORKER_EXECUTOR = env_str("WORKER_EXECUTOR", "local").lower()
if WORKER_EXECUTOR not in {"local", "container"}:
    raise EnvError(f"WORKER_EXECUTOR={WORKER_EXECUTOR!r} must be local or container")
CONTAINER_RUNTIME = env_str("CONTAINER_RUNTIME", "podman")
# --- Slurm (worker/executors/slurm.py; `manage.py slurm_agent`) ---
# An attempt's relay token stays valid for the job's timeout plus this (and only while current).
ATTEMPT_TOKEN_SLACK_S = env_int("ATTEMPT_TOKEN_SLACK_S", 3600, minimum=60)
# The portal's address as the Slurm nodes reach it (the relay posts events there).
SLURM_PORTAL_URL = env_str("SLURM_PORTAL_URL")
SLURM_PARTITION = env_str("SLURM_PARTITION")
# Python with Ultralytics on the Slurm nodes, and this checkout's path there (shared filesystem).
SLURM_PYTHON = env_str("SLURM_PYTHON")
SLURM_CODE_DIR = env_str("SLURM_CODE_DIR")
# Images the partition's nodes run (NODE_IMAGES when empty).
SLURM_IMAGES = env_list("SLURM_IMAGES", [])
# The partition's GRES GPUs are device files without a GPU (test clusters): train on CPU.
SLURM_SIMULATED_GPUS = env_bool("SLURM_SIMULATED_GPUS", False)
SLURM_POLL_S = env_float("SLURM_POLL_S", 1.0, minimum=0.1)
SLURM_SYNC_S = env_float("SLURM_SYNC_S", 5.0, minimum=0.5)
# A portal job pending in Slurm this long is withdrawn (scancel) and requeued through the portal.
SLURM_PENDING_LIMIT_S = env_float("SLURM_PENDING_LIMIT_S", 600.0, minimum=1.0)
# sbatch --signal=B:USR1@N: the relay asks the child to stop after its next checkpoint.
SLURM_SIGNAL_S = env_int("SLURM_SIGNAL_S", 300, minimum=10)
# --mem for a job that asked no memory (Slurm would otherwise give it the whole node).
SLURM_DEFAULT_MEM_MB = env_int("SLURM_DEFAULT_MEM_MB", 4096, minimum=64)

# CUDA out of memory: the attempt is retried from its checkpoint with half the batch, this often.
CUDA_OOM_RETRIES = env_int("CUDA_OOM_RETRIES", 2, minimum=0, maximum=5)

WEIGHTS_DIR = env_path("WEIGHTS_DIR", DATA_DIR / "weights")
DATASETS_DIR = env_path("DATASETS_DIR", DATA_DIR / "datasets")
JOBS_DIR = env_path("JOBS_DIR", DATA_DIR / "jobs")
# A worker whose JOBS_DIR has less room than this takes no new work ("storage full": its node's
# storage problem), and a training that fails meanwhile was stopped by the full disk, not by its
# own fault: requeued, not a retry (worker.artifacts.jobs_dir_full). A YOLOv8x checkpoint is ~0.5 GB.
JOBS_DIR_MIN_FREE_MB = env_float("JOBS_DIR_MIN_FREE_MB", 1024.0, minimum=0.0)
# Registry files: uploaded weights and exports (models/<team>/<name>/v<N>/…); apps/core/artifacts.py.
MODELS_DIR = env_path("MODELS_DIR", DATA_DIR / "models")

# Where artifacts' bytes live (apps/core/storage.py): their files under the roots above (a
# shared DATA_DIR) by default; an S3-compatible bucket when ARTIFACTS_S3_BUCKET is set
# (credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY). Nodes without the shared
# DATA_DIR keep fetched artifacts in ARTIFACTS_CACHE_DIR, keyed by sha256.
ARTIFACTS_S3_BUCKET = env_str("ARTIFACTS_S3_BUCKET", "")
ARTIFACTS_S3_ENDPOINT_URL = env_str("ARTIFACTS_S3_ENDPOINT_URL", "") or None
ARTIFACTS_S3_REGION = env_str("ARTIFACTS_S3_REGION", "us-east-1")
ARTIFACTS_CACHE_DIR = env_path("ARTIFACTS_CACHE_DIR", DATA_DIR / "cache")
# A GPU node prunes its cache to this size (least recently used entries no job there holds;
# worker/cache.py) at worker start and after each attempt.
ARTIFACTS_CACHE_MAX_GB = env_float("ARTIFACTS_CACHE_MAX_GB", 20.0, minimum=0.0)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "artifacts": (
        {"BACKEND": "apps.core.s3_storage.ArtifactS3Storage",
         "OPTIONS": {"bucket_name": ARTIFACTS_S3_BUCKET, "endpoint_url": ARTIFACTS_S3_ENDPOINT_URL,
                     "region_name": ARTIFACTS_S3_REGION, "file_overwrite": True, "default_acl": None,
                     "querystring_auth": True, "querystring_expire": 300}}
        if ARTIFACTS_S3_BUCKET else {"BACKEND": "apps.core.storage.ArtifactFileSystemStorage"}
    ),
}

API_TOKEN_DEFAULT_DAYS = env_int("API_TOKEN_DEFAULT_DAYS", 90, minimum=1, maximum=3650)
DATASET_UPLOAD_MAX_BYTES = env_int("DATASET_UPLOAD_MAX_BYTES", 2 * 1024**3, minimum=1024)
DATASET_MAX_UNCOMPRESSED_BYTES = env_int("DATASET_MAX_UNCOMPRESSED_BYTES", 20 * 1024**3, minimum=1024)
DATASET_MAX_FILES = env_int("DATASET_MAX_FILES", 200_000, minimum=1)
DATASET_MAX_RATIO = env_float("DATASET_MAX_RATIO", 100.0, minimum=1.0)
# Uploaded weights (.pt): the largest official checkpoint (YOLO11x) is ~110 MB; a trained one with its
# optimizer state about three times the weights.
WEIGHTS_UPLOAD_MAX_BYTES = env_int("WEIGHTS_UPLOAD_MAX_BYTES", 1024**3, minimum=1024)
# What one team may keep in uploaded datasets and weights together (Team.storage_quota_gb overrides it).
TEAM_STORAGE_QUOTA_GB = env_float("TEAM_STORAGE_QUOTA_GB", 100.0, minimum=0.0)
# Images one predict job may annotate (each one is a stored JPEG).
PREDICT_MAX_IMAGES = env_int("PREDICT_MAX_IMAGES", 1000, minimum=1)

# --- Notifications (apps/notifications; sent by `manage.py notify_worker`) ------------------
# The portal's public address, for links in messages ("" = no links).
PORTAL_URL = env_str("PORTAL_URL")
# Seconds between a failed delivery's retries (backoff); one retry per value, then it is failed.
try:
    NOTIFY_RETRY_INTERVALS = [int(v) for v in env_list("NOTIFY_RETRY_INTERVALS", ["10", "60", "300", "900", "3600"])]
except ValueError:
    raise EnvError("NOTIFY_RETRY_INTERVALS must be comma-separated whole seconds, e.g. 10,60,300") from None
# Webhook/apprise targets on loopback or private addresses are refused (SSRF) unless this is on.
NOTIFY_ALLOW_PRIVATE_TARGETS = env_bool("NOTIFY_ALLOW_PRIVATE_TARGETS", False)
NOTIFY_TIMEOUT_S = env_float("NOTIFY_TIMEOUT_S", 10.0, minimum=0.5)
# How often the leading scheduler redoes the notifications Redis lost (a job event committed
# while it was down queued nothing): apps.notifications.tasks.catch_up.
NOTIFY_CATCH_UP_S = env_float("NOTIFY_CATCH_UP_S", 60.0, minimum=1.0)
NOTIFY_SMTP_HOST = env_str("NOTIFY_SMTP_HOST", "127.0.0.1")
# Whether an operator named a mail server: without it mail goes to 127.0.0.1 (a local MTA, if
# one runs), and a new email channel's answer says so (manager trial F20).
NOTIFY_SMTP_CONFIGURED = bool(env_str("NOTIFY_SMTP_HOST").strip())
NOTIFY_SMTP_PORT = env_int("NOTIFY_SMTP_PORT", 25, minimum=1, maximum=65535)
NOTIFY_SMTP_USER = env_str("NOTIFY_SMTP_USER")
NOTIFY_SMTP_PASSWORD = env_str("NOTIFY_SMTP_PASSWORD")
NOTIFY_SMTP_SECURITY = env_str("NOTIFY_SMTP_SECURITY", "insecure").lower()
if NOTIFY_SMTP_SECURITY not in {"insecure", "starttls", "ssl"}:
    raise EnvError(f"NOTIFY_SMTP_SECURITY={NOTIFY_SMTP_SECURITY!r} must be insecure, starttls or ssl")
NOTIFY_FROM = env_str("NOTIFY_FROM", "yoloportal@localhost")

# --- HTTPS and session security (Django's deployment checklist; docs/security.md) ----------
# SECURE=true behind HTTPS: secure cookies, HSTS, redirect to https. Off by default so
# `make run` works on http://127.0.0.1.
SECURE = env_bool("SECURE", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = SECURE
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = CSRF_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 12 * 3600, minimum=60)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", SECURE)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000 if SECURE else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", SECURE)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", SECURE)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Only when the proxy in front sets X-Forwarded-Proto (and strips it from clients).
if env_bool("SECURE_PROXY_SSL_HEADER", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Prometheus scrapes /metrics with "Authorization: Bearer <METRICS_TOKEN>". Without a token,
# anonymous scrapes are served only where asked for (METRICS_OPEN=true; `make run` does, and DEBUG
# defaults it on), never under SECURE=true, and never with the per-job series (job id, team,
# losses): those need the token (sec22).
METRICS_TOKEN = env_str("METRICS_TOKEN")
METRICS_OPEN = env_bool("METRICS_OPEN", DEBUG)
# Health and metrics probes come over plain HTTP from inside the cluster.
SECURE_REDIRECT_EXEMPT = [r"^metrics$"]

# LOG_FORMAT=json: one JSON object per line with request_id / job_id / attempt / node (yoloportal/logs.py).
LOG_FORMAT = env_str("LOG_FORMAT", "plain").lower()
LOGGING = logging_config(log_format=LOG_FORMAT, level=env_str("LOG_LEVEL", "INFO"))

__all__ = ["EnvError"]
