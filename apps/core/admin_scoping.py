"""Manager-scoped Django admin: a team manager sees and edits only their teams' rows.

Django's admin normally asks the auth permission tables; here the team role decides.
A superuser sees everything. A staff user who manages at least one team (role manager
or admin in :class:`~apps.accounts.models.Membership`) sees the rows whose team they
manage, and nothing else: querysets, foreign-key choices, list filters and saves are
all scoped. Anyone else sees nothing.

Use it on any team-owned model::

    @admin.register(Dataset)
    class DatasetAdmin(TeamScopedAdmin, admin.ModelAdmin):
        team_field = "team"            # the lookup path from the row to its Team
        manager_can_add = True

For rows that belong to nobody's team (nodes, the RQ dashboard) use
:class:`SuperuserEditAdmin`.

apps/core imports no app: the team model and the "teams this user manages" read are
named by the settings ``TEAM_MODEL`` and ``MANAGED_TEAM_IDS`` (as ``AUTH_USER_MODEL``
names the user model) and looked up on first use.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import cache, wraps

from django.apps import apps
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth.decorators import user_passes_test
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Model, ProtectedError, RestrictedError
from django.utils.module_loading import import_string


def team_model() -> type[Model]:
    """The model ``settings.TEAM_MODEL`` names ("accounts.Team")."""
    return apps.get_model(settings.TEAM_MODEL)


@cache
def _managed_team_ids() -> Callable[..., list[int]]:
    return import_string(settings.MANAGED_TEAM_IDS)


def managed_ids(request) -> list[int]:
    """The teams the request's user manages, computed once per request."""
    cached = getattr(request, "_managed_team_ids", None)
    if cached is None:
        user = request.user
        cached = _managed_team_ids()(user=user) if user.is_active and user.is_staff else []
        request._managed_team_ids = cached
    return cached


class ManagedTeamFilter(admin.SimpleListFilter):
    """A ``team`` list filter that offers only the teams the viewer manages."""

    title = "team"
    parameter_name = "team"

    def lookups(self, request, model_admin):
        Team = team_model()
        teams = Team.objects.all() if request.user.is_superuser else Team.objects.filter(pk__in=managed_ids(request))
        return [(str(t.pk), t.slug) for t in teams]

    def queryset(self, request, queryset):
        value = self.value()
        if not value:
            return queryset
        # The link this filter prints holds the team's id; a hand-typed ?team=vision (the name every
        # other page uses), a stale or cut-off link was a ValueError in the query, a 500, on every
        # team-scoped list (managers' admin week, trial30b). Nothing matches, and the list says why.
        # (int() of over 4300 digits raises: no int() of more than 19, review32)
        if not value.isascii() or not value.isdigit() or len(value.lstrip("0")) > 19 or int(value) >= 2**63:
            from django.contrib import messages

            teams = team_model().objects.filter(slug=value)
            if not request.user.is_superuser:  # another team's name is answered as an unknown one
                teams = teams.filter(pk__in=managed_ids(request))
            named = teams.values_list("pk", flat=True).first()
            hint = f" (team {value}'s filter is ?{self.parameter_name}={named})" if named is not None else ""
            messages.warning(request, f"{self.parameter_name}={value[:40]!r} is not a team's id: nothing is shown"
                                      f"{hint}; choose the team in the filter")
            return queryset.none()
        return queryset.filter(**{f"{self._team_field}__pk": int(value)})

    def __init__(self, request, params, model, model_admin):
        self._team_field = getattr(model_admin, "team_field", "team")
        super().__init__(request, params, model, model_admin)


def _lookup_target(model, key: str):
    """The field whose values a change-list lookup ``key`` (``user``, ``team__id__exact``,
    ``id__in``) compares, and its lookup ("exact", "in", ...); (None, "") where it is no field."""
    from django.core.exceptions import FieldDoesNotExist
    from django.db.models.constants import LOOKUP_SEP

    opts, field, parts = model._meta, None, key.split(LOOKUP_SEP)
    while parts and opts is not None:
        try:
            field = opts.pk if parts[0] == "pk" else opts.get_field(parts[0])
        except FieldDoesNotExist:
            break
        parts.pop(0)
        opts = field.related_model._meta if field.is_relation and field.related_model else None
    if field is None or len(parts) > 1:  # not a field, or a transform (created__year__gte): Django's to judge
        return None, ""
    if field.is_relation and field.related_model:  # ?user=5 compares the user's id (or the key's to_field)
        field = field.target_field if field.concrete else field.related_model._meta.pk
    return field, parts[0] if parts else "exact"


def lookup_problem(model, key: str, values: list[str], db: str = "default") -> str | None:
    """Why a change list's ``?key=value`` can match nothing, where its value is no value of an
    integer column (a word, nothing, a number past the column's range); None otherwise.

    Django filtered by it as given: a 23-digit ``?user=`` or ``?team__id__exact=`` was an
    OverflowError on SQLite, a 500 (Django 5.2 guards a plain integer field's own lookups, not a
    foreign key's), and a word a redirect to ``?e=1`` that said nothing (managers' admin week)."""
    from django.core.exceptions import ValidationError
    from django.db import connections

    field, lookup = _lookup_target(model, key)
    if field is None or lookup not in ("exact", "in", "gt", "gte", "lt", "lte"):
        return None
    ops = connections[db].ops
    if field.get_internal_type() not in ops.integer_field_ranges:  # not an integer column (SQLite's
        return None  # integer_field_range answers 64 bits for any type, a UUID's too)
    low, high = ops.integer_field_range(field.get_internal_type())
    for given in values:
        for one in given.split(",") if lookup == "in" else [given]:
            try:
                value = field.to_python(one)
            except ValidationError:
                value = None
            if value is None or not low <= value <= high:
                what = (f"the id of a {field.model._meta.verbose_name}" if field.primary_key
                        else f"a whole number from {low} to {high}")
                return f"{key}={one[:40]!r} is not {what}: nothing is shown"
    return None


class LookupsCheckedChangeList(ChangeList):
    """A change list whose lookups (the stock filters' and hand-made ones) that no row can match
    (:func:`lookup_problem`) show nothing and say why, where the query raised."""

    def get_queryset(self, request, exclude_parameters=None):
        from django.contrib import messages
        from django.contrib.admin.filters import SimpleListFilter

        # A SimpleListFilter reads its own parameter (ManagedTeamFilter's ?team= is checked there).
        own = {f.parameter_name for f in self.list_filter if isinstance(f, type) and issubclass(f, SimpleListFilter)}
        problems = [problem for key, values in self.get_filters_params().items() if key not in own
                    if (problem := lookup_problem(self.model, key, values, self.root_queryset.db))]
        try:
            queryset = super().get_queryset(request, exclude_parameters)
        except IncorrectLookupParameters:  # a word for an id: Django's redirect to ?e=1 said nothing
            if not problems or not hasattr(self, "has_active_filters"):  # the filters were not read
                raise
            queryset = self.root_queryset
            self.clear_all_filters_qs = self.get_query_string(remove=self.get_filters_params())
        if not problems:
            return queryset
        if not getattr(request, "_lookup_problems_said", False):  # facets ask again, once per filter
            request._lookup_problems_said = True
            for problem in problems:
                messages.warning(request, problem)
        return queryset.none()


class LookupsChecked:
    """Mixin for ModelAdmin: its change list is a :class:`LookupsCheckedChangeList`. The admin site
    puts it on every registered ModelAdmin (apps.accounts.admin_audit.AuditedAdminSite)."""

    def get_changelist(self, request, **kwargs):
        return LookupsCheckedChangeList


class SelectionChecked:
    """Mixin for ModelAdmin: an action's selection (``_selected_action``, the ids the change list
    printed) that holds something no id can be — a word for a UUID or a number, nothing, a number
    past the column's range — does nothing and says so. Django filtered by it as given: the query
    raised, a 500 (trial28 F7; only a hand-made POST sends one)."""

    def response_action(self, request, queryset):
        from django.contrib import messages
        from django.contrib.admin import helpers
        from django.core.exceptions import ValidationError
        from django.db import connections

        field = self.model._meta.pk
        try:
            low, high = connections[queryset.db].ops.integer_field_range(field.get_internal_type())
        except KeyError:  # not an integer column
            low = high = None
        for given in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
            try:
                value = field.to_python(given)
            except ValidationError:
                value = None
            if value is None or (isinstance(value, int) and low is not None and not low <= value <= high):
                self.message_user(request, f"{given[:40]!r} is not the id of a {self.model._meta.verbose_name}: "
                                           "nothing was done", messages.WARNING)
                return None
        return super().response_action(request, queryset)


class UnseenAsMissing(SelectionChecked):
    """Mixin for ModelAdmin: a row outside the viewer's ``get_queryset`` (another team's) answers
    its change, delete and history pages exactly as a row that does not exist."""

    def unseen_answer(self, request, object_id):
        """Django's "doesn't exist" redirect when the row is not in the viewer's queryset (another
        team's, or none at all), before any permission check; None otherwise.

        Django checks the permission first on the delete page and on a change page's POST: where
        managers may not delete (or change) a model, another team's row answered 403 there and a
        redirect on its change and history pages. Now each page answers another team's row exactly
        as a row that does not exist, and a 403 is only ever about a row the viewer can see."""
        from django.contrib.admin.options import TO_FIELD_VAR
        from django.contrib.admin.utils import unquote

        to_field = request.POST.get(TO_FIELD_VAR, request.GET.get(TO_FIELD_VAR))
        if to_field and not self.to_field_allowed(request, to_field):
            return None  # Django refuses the field itself (DisallowedModelAdminToField), row or no row
        # A popup's lookup (?_to_field=id) is answered the same way: skipping it, its POST was a 403.
        if self.get_object(request, unquote(object_id), to_field) is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        return None

    def change_view(self, request, object_id, form_url="", extra_context=None):
        return self.unseen_answer(request, object_id) or super().change_view(request, object_id, form_url,
                                                                             extra_context)

    def delete_view(self, request, object_id, extra_context=None):
        return self.unseen_answer(request, object_id) or super().delete_view(request, object_id, extra_context)

    def history_view(self, request, object_id, extra_context=None):
        return self.unseen_answer(request, object_id) or super().history_view(request, object_id, extra_context)


class TeamScopedAdmin(UnseenAsMissing):
    """Mixin for ModelAdmin: permissions and rows follow the viewer's managed teams.

    ``team_field``           lookup path from the row to its Team ("team", "job__team"; "pk" for Team)
    ``manager_can_add``      managers may create rows (for their teams)
    ``manager_can_change``   managers may edit rows of their teams
    ``manager_can_delete``   managers may delete rows of their teams
    ``superuser_only_fields`` fields a manager sees read-only (e.g. a team's fair-share weight)
    """

    team_field: str = "team"
    manager_can_add: bool = False
    manager_can_change: bool = True
    manager_can_delete: bool = False
    superuser_only_fields: tuple[str, ...] = ()

    # --- which rows -----------------------------------------------------------------------

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        return queryset.filter(**{f"{self.team_field}__in": managed_ids(request)})

    def team_of(self, obj) -> int | None:
        """The id of the team ``obj`` belongs to (follows ``team_field``)."""
        if self.team_field == "pk":
            return obj.pk
        value = obj
        for part in self.team_field.split("__"):
            value = getattr(value, part, None)
            if value is None:
                return None
        return value.pk if isinstance(value, team_model()) else value

    def manages(self, request, obj=None) -> bool:
        if request.user.is_superuser:
            return True
        teams = managed_ids(request)
        if not teams:
            return False
        return obj is None or self.team_of(obj) in teams

    # --- what the viewer may do -------------------------------------------------------------

    def has_module_permission(self, request):
        return self.manages(request)

    def has_view_permission(self, request, obj=None):
        return self.manages(request, obj)

    def has_change_permission(self, request, obj=None):
        if request.user.is_superuser:
            return True
        return self.manager_can_change and self.manages(request, obj)

    def has_add_permission(self, request, *args):
        if request.user.is_superuser:
            return True
        return self.manager_can_add and self.manages(request)

    def has_delete_permission(self, request, obj=None):
        if request.user.is_superuser:
            return True
        return self.manager_can_delete and self.manages(request, obj)

    def get_readonly_fields(self, request, obj=None):
        fields = list(super().get_readonly_fields(request, obj))
        if not request.user.is_superuser:
            fields += [f for f in self.superuser_only_fields if f not in fields]
        return fields

    def get_list_filter(self, request):
        # The stock related-field filter would list every team; offer only the managed ones.
        return [ManagedTeamFilter if f == self.team_field else f for f in super().get_list_filter(request)]

    # --- choices and saves --------------------------------------------------------------------

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.related_model is team_model() and not request.user.is_superuser:
            kwargs["queryset"] = team_model().objects.filter(pk__in=managed_ids(request))
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request, obj, form, change):
        # Defence in depth: the form already offers only managed teams.
        if not self.manages(request, obj):
            raise PermissionDenied("you do not manage that team")
        super().save_model(request, obj, form, change)

    def delete_model(self, request, obj):
        if not self.manages(request, obj):
            raise PermissionDenied("you do not manage that team")
        super().delete_model(request, obj)


class TeamScopedInline(TeamScopedAdmin):
    """The same rules for inlines. Django passes the *parent* to an inline's permission
    checks, so ``parent_team_field`` leads from the parent to its team ("pk" when the
    parent is the Team itself); ``team_field`` still scopes the inline's own rows."""

    parent_team_field: str = "pk"

    def team_of(self, obj) -> int | None:
        if self.parent_team_field == "pk":
            return obj.pk if isinstance(obj, team_model()) else None
        value = obj
        for part in self.parent_team_field.split("__"):
            value = getattr(value, part, None)
            if value is None:
                return None
        return value.pk if isinstance(value, team_model()) else value

    def has_add_permission(self, request, obj=None):
        if request.user.is_superuser:
            return True
        return self.manager_can_add and self.manages(request)


class SuperuserEditAdmin(SelectionChecked):
    """Shared infrastructure: staff managers may look, only superusers change anything."""

    def has_module_permission(self, request):
        return request.user.is_superuser or bool(managed_ids(request))

    def has_view_permission(self, request, obj=None):
        return self.has_module_permission(request)

    def has_change_permission(self, request, obj=None):
        return request.user.is_superuser

    def has_add_permission(self, request, *args):
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser


class SuperuserOnlyAdmin(SuperuserEditAdmin):
    """Not shown to managers at all (API tokens of other people, the RQ dashboard)."""

    def has_module_permission(self, request):
        return request.user.is_superuser


class SuperuserRecordsAdmin(SuperuserOnlyAdmin):
    """Records the system writes (deliveries, hourly history): superusers look, nobody edits."""

    def has_change_permission(self, request, obj=None):
        return False

    def has_add_permission(self, request, *args):
        return False


def superuser_required(view, *, why: str = "superusers only"):
    """Wrap a view so only active superusers reach it: someone not signed in goes to the admin
    sign-in; a signed-in staff user gets a 403 that says why (trial 14, F9: a manager was sent to
    the sign-in page they had just passed)."""
    check = user_passes_test(lambda u: u.is_active and u.is_authenticated, login_url="admin:login")

    def superuser_only(request, *args, **kwargs):
        if not request.user.is_superuser:
            raise PermissionDenied(why)
        return view(request, *args, **kwargs)

    return wraps(view)(check(wraps(view)(superuser_only)))


def superuser_only_patterns(patterns: list, *, why: str = "superusers only") -> list:
    """The same URL patterns with every view wrapped by :func:`superuser_required`."""
    wrapped = []
    for pattern in patterns:
        clone = copy.copy(pattern)
        clone.callback = superuser_required(pattern.callback, why=why)
        wrapped.append(clone)
    return wrapped


class GuardedDeleteAdmin:
    """A delete that would strand something is refused with the reason :meth:`delete_refusal`
    gives: on the object's own delete page (a message, back to its change page) and in the bulk
    "delete selected" action (listed as protected on the confirmation, which Django then
    refuses). By default the deletion guards of :mod:`apps.core.guards` (a dataset or model
    version an active job uses); a node, a team's last manager override it."""

    refused_words = "not deleted"

    def delete_refusal(self, obj) -> str | None:
        from apps.core.guards import deletion_refusal

        return deletion_refusal(obj)

    def delete_view(self, request, object_id, extra_context=None):
        from django.contrib import messages
        from django.http import HttpResponseRedirect
        from django.urls import reverse

        obj = self.get_object(request, object_id)
        allowed = obj is not None and self.has_delete_permission(request, obj)  # else Django's own 403/404
        refusal = self.delete_refusal(obj) if allowed else None
        if not refusal:
            try:
                return super().delete_view(request, object_id, extra_context)
            except (DeleteRefused, ProtectedError, RestrictedError) as exc:
                refusal = self.refusal_found_at_delete(obj, exc)
        self.message_user(request, f"{self.refused_words}: {refusal}", messages.ERROR)
        meta = self.model._meta
        return HttpResponseRedirect(reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[obj.pk]))

    def response_action(self, request, queryset):
        # "delete selected" logs, then deletes: one transaction, so that a refusal found at the delete
        # leaves no log of a deletion that did not happen (Django's action is not one).
        from django.contrib import messages

        try:
            with transaction.atomic(using=queryset.db):
                return super().response_action(request, queryset)
        except (DeleteRefused, ProtectedError, RestrictedError) as exc:
            self.message_user(request, f"{self.refused_words}: {self.refusal_found_at_delete(None, exc)}",
                              messages.ERROR)
            return None  # Django goes back to the list

    def refusal_found_at_delete(self, obj, exc: Exception) -> str:
        """What the delete itself found, after the confirmation's checks had passed: a
        :class:`DeleteRefused` (a check taken again under a lock), or a row Django's PROTECT keeps
        that appeared meanwhile (a dataset registered to the team being deleted: a ProtectedError,
        a 500; review32). The refusal read again names it where it can; else the rows, the first few."""
        if isinstance(exc, DeleteRefused):
            return str(exc)
        if obj is not None and (refusal := self.delete_refusal(obj)):
            return refusal
        rows = list(getattr(exc, "protected_objects", None) or getattr(exc, "restricted_objects", None) or [])
        named = ", ".join(f"{row._meta.verbose_name} {row}" for row in rows[:DELETE_ROWS_SHOWN])
        more = f" … ({len(rows)} in all)" if len(rows) > DELETE_ROWS_SHOWN else ""
        return f"still used by {named}{more} (added meanwhile): delete those first"

    def get_deleted_objects(self, objs, request):
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        refusals = [refusal for obj in objs if (refusal := self.delete_refusal(obj))]
        return deleted, counts, perms_needed, [*protected, *refusals]


DELETE_ROWS_SHOWN = 3


class DeleteRefused(Exception):
    """A ``delete_model`` or ``delete_queryset`` that found, under its lock, a reason the confirmation's
    checks could not see yet (another admin removed a team's other manager meanwhile):
    :class:`GuardedDeleteAdmin` says it, an error message, and nothing of the delete stays."""


class ChangeRefused(Exception):
    """What a ``save_model`` found changed under it between the form's checks and the save (a row
    another admin removed, a job the scheduler placed): the change page says it, an error message,
    and nothing of the save stays (Django's change view is one transaction). It was a 500."""


class RefusableChangeAdmin:
    """Answers :class:`ChangeRefused` with its message, back on the page the POST came from."""

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        from django.contrib import messages
        from django.http import HttpResponseRedirect

        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except ChangeRefused as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())


class ChangedFieldsSaveAdmin(RefusableChangeAdmin):
    """A change page saves the columns its form changed, nothing else (``update_fields``).

    Django saves the whole row as it read it at the POST: what another process wrote to the row
    meanwhile was written back over with that older copy — a job that ended ran again (review31),
    a node's state and heartbeat went back (the worker's), a dataset's hash and statistics (a
    re-registration's), a model version's stage (a promotion through the portal or the API), another
    admin's edit of the scheduler configuration (fix31a). A form that changed nothing writes nothing.
    The row's ``auto_now`` columns (``updated_at``) are saved with it, as a whole-row save did.

    Put it after the admin's permission mixins (``TeamScopedAdmin`` checks first, then calls on) and
    before ``admin.ModelAdmin``; an add is Django's whole save."""

    def save_model(self, request, obj, form, change):
        if not change:
            return super().save_model(request, obj, form, change)
        fields = self.changed_columns(obj, form)
        if fields:
            # The row locked first (the change view's transaction holds it): deleted since the POST read
            # it, Django's update_fields save raised "did not affect any rows", a 500 (review32).
            if not type(obj)._base_manager.select_for_update().filter(pk=obj.pk).exists():
                raise self.deleted_meanwhile(obj)
            stamped = [f.name for f in obj._meta.concrete_fields if getattr(f, "auto_now", False)]
            obj.save(update_fields=[*fields, *(name for name in stamped if name not in fields)])
        return None

    @staticmethod
    def deleted_meanwhile(obj) -> ChangeRefused:
        return ChangeRefused(f"nothing saved: {obj._meta.verbose_name} “{obj}” was deleted meanwhile")

    @staticmethod
    def changed_columns(obj, form) -> list[str]:
        """The form's changed fields that are the row's own columns (not many-to-many: save_related's)."""
        columns = {f.name for f in obj._meta.concrete_fields}
        return [name for name in form.changed_data if name in columns]
