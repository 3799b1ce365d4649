"""Every change made through Django admin leaves an audit entry with the before and after values.

:class:`AuditedAdminSite` is the project's admin site (``AuditedAdminConfig`` in
``INSTALLED_APPS`` replaces ``django.contrib.admin``). Its ``register`` puts
:class:`AuditedModelAdmin` in front of every ModelAdmin — ours, Django's User/Group and
django-rq's — so no admin can be added that skips the audit
(``tests/security/test_admin_audit.py::test_every_registered_admin_is_audited``).

What is recorded (``AuditEntry``; team = the row's team where it has one):

- ``admin.add``: the values the form set;
- ``admin.change``: ``{"changes": {field: {"from": before, "to": after}}}`` for each field
  whose stored value changed (nothing when a save changes nothing);
- ``admin.delete``: every field's value before the delete;
- ``admin.action``: one entry per selected row the action changed, with the action's name and
  the fields it changed (before/after, read back from the database; none for a row it left alone,
  none for a row whose change the action's service audited itself: ``model.promote``, ``job.cancel``);
- inline rows (memberships on a team's page) the same way.

Admins may name their own actions (``audit_add_action``/``audit_change_action``, e.g.
``quota.change``). Services called from admin (cancel, requeue, deletes of models,
datasets and memberships) record their own entries too.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import wraps
from typing import Any

from django.contrib import admin
from django.db.models import Model

from apps.core.admin_scoping import LookupsChecked

from .models import AuditEntry
from .services import audit_record

# Never copy these into an entry: a password hash is a secret even when hashed.
SECRET_FIELDS = {"password", "key_hash"}
# Counters every event moves (a job's message number, its stored log size): what an action did
# to them is bookkeeping, not what it did (manager trial F26: a cancel listed its ``seq``).
BOOKKEEPING_FIELDS = {"seq", "log_bytes"}


def plain(value: Any) -> Any:
    """A field value as JSON an audit entry can hold (a related row by its name)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Model):
        return str(value)
    if isinstance(value, (list, tuple, dict)):
        return json.loads(json.dumps(value, default=str))
    if isinstance(value, datetime):
        # To the second, as admin's form sends it: saving a user recorded last_login and
        # date_joined as changed, their microseconds dropped by the form (manager trial 15, F6).
        return str(value.replace(microsecond=0))
    return str(value)


def audited_fields(model: type[Model]) -> list:
    return [f for f in model._meta.get_fields()
            if (f.concrete or f.many_to_many) and not f.auto_created and getattr(f, "editable", False)]


def snapshot(obj: Model, names: set[str] | None = None) -> dict[str, Any]:
    """Field name → plain value, for ``names`` (all editable fields when None)."""
    values = {}
    for field in audited_fields(type(obj)):
        if names is not None and field.name not in names:
            continue
        if field.name in SECRET_FIELDS:
            values[field.name] = "(secret)"
        elif field.many_to_many:
            values[field.name] = sorted(str(o) for o in getattr(obj, field.name).all()) if obj.pk else []
        else:
            values[field.name] = plain(getattr(obj, field.name, None))
    return values


def diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: {"from": before.get(name), "to": value} for name, value in after.items()
            if before.get(name) != value}


def shown(value: Any, *, limit: int = 60) -> str:
    """A recorded value as an audit message quotes it."""
    if value is None:
        return "none"
    text = value if isinstance(value, str) else json.dumps(value, default=str) if isinstance(value, (list, dict)) \
        else str(value)
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return repr(text) if isinstance(value, str) else text


def changes_in_words(changes: dict[str, dict[str, Any]]) -> str:
    """What changed, for the History page's "What" column: "deactivated" / "reactivated" for an
    account's active flag, else ``field old → new``. A deactivation and a reactivation read the
    same row, "admin.change user carol by admin" (manager trial 15, F6); a drain and a resume
    did not say why (F8)."""
    words = []
    for name, change in changes.items():
        before, after = change.get("from"), change.get("to")
        if name == "is_active" and isinstance(after, bool) and before is not None:
            words.append("reactivated" if after else "deactivated")
        else:
            words.append(f"{name} {shown(before)} → {shown(after)}")
    return "; ".join(words)


def stored(obj: Model) -> Model | None:
    """The row as the database has it now (None for a new one)."""
    if obj.pk is None:
        return None
    return type(obj)._base_manager.filter(pk=obj.pk).first()


def described(obj: Model) -> str:
    """The object as an audit message names it: its text, after its kind unless the text says it
    already. The action has a column of its own ("scheduler.config scheduler configuration
    scheduler configuration (fair)" said two things three times; manager trial F26)."""
    text, kind = str(obj)[:200], str(obj._meta.verbose_name)
    return text if set(kind.lower().split()) & set(text.lower().split()) else f"{kind} {text}"


class AuditedModelAdmin:
    """Mixin (first in the MRO) that records every admin write; see the module docstring."""

    # An admin may name its add/change entries with ``audit_add_action``/``audit_change_action``.
    # Read with getattr: this mixin comes first in the MRO, so a default here would hide them.

    def audit_team(self, obj: Model):
        # team_of follows this admin's own model; an inline's row (a team's membership, saved
        # through the team page) names its team itself — team_of would read its pk as a team.
        team_of = getattr(self, "team_of", None)
        if team_of is not None and isinstance(obj, self.model):
            try:
                return team_of(obj)
            except AttributeError:
                return None
        return getattr(obj, "team_id", None)

    def audit(self, request, entry_action: str, obj: Model, *, target_id: str | None = None,
              named: str | None = None, **data: Any) -> None:
        """``named``: the object as described before a delete (afterwards a job read "long-1 (None)":
        its text holds its primary key, gone with the row; operator trial 20, F3)."""
        data = {"model": obj._meta.label, **data}
        # An action's entry names it, and a change's says what changed (the drain's reason, a
        # deactivation): a node's History read the same row for a drain and a resume (manager
        # trial 15, F8), a user's for a deactivation and a reactivation (F6).
        said = changes_in_words(data["changes"]) if data.get("changes") else ""
        audit_record(actor=request.user, action=entry_action, team=self.audit_team(obj), target=obj,
                     target_id=target_id, data=data,
                     message=f"{data['action'] + ': ' if 'action' in data else ''}{named or described(obj)} "
                             f"by {request.user.get_username()}" + (f": {said}" if said else ""))

    # --- the main form ---------------------------------------------------------------------

    def save_model(self, request, obj, form, change):
        names = {f.name for f in audited_fields(type(obj)) if f.name in form.fields}
        previous = stored(obj) if change else None
        before = snapshot(previous, names) if previous is not None else dict.fromkeys(names)
        super().save_model(request, obj, form, change)
        after = snapshot(obj, names)
        for name in names & {f.name for f in audited_fields(type(obj)) if f.many_to_many}:
            if name in form.cleaned_data:  # saved later by save_related: the form has the new set
                after[name] = sorted(str(o) for o in form.cleaned_data[name])
        changes = diff(before, after)
        if changes:
            action = (getattr(self, "audit_change_action", AuditEntry.Action.ADMIN_CHANGE) if change
                      else getattr(self, "audit_add_action", AuditEntry.Action.ADMIN_ADD))
            self.audit(request, action, obj, changes=changes)

    def delete_model(self, request, obj):
        before, target_id, named = snapshot(obj), str(obj.pk), described(obj)
        super().delete_model(request, obj)
        self.audit(request, AuditEntry.Action.ADMIN_DELETE, obj, target_id=target_id, named=named, before=before)

    def delete_queryset(self, request, queryset):
        rows = [(obj, snapshot(obj), str(obj.pk), described(obj)) for obj in queryset]
        super().delete_queryset(request, queryset)
        for obj, before, target_id, named in rows:
            # Gone, as delete_model's row is (Django empties its pk): a team's own entry named the
            # team just deleted as its team, a foreign key to no row refused at commit (a 500; left31).
            setattr(obj, obj._meta.pk.attname, None)
            self.audit(request, AuditEntry.Action.ADMIN_DELETE, obj, target_id=target_id, named=named,
                       before=before)

    # --- inlines ------------------------------------------------------------------------------

    def save_formset(self, request, form, formset, change):
        pending = []
        for inline_form in formset.forms:
            cleaned = getattr(inline_form, "cleaned_data", None)
            instance = inline_form.instance
            if not cleaned:
                continue
            if formset.can_delete and formset._should_delete_form(inline_form):
                if instance.pk is not None:
                    pending.append((AuditEntry.Action.ADMIN_DELETE, instance, snapshot(instance),
                                    (str(instance.pk), described(instance))))
                continue
            if inline_form.has_changed():
                names = {f.name for f in audited_fields(type(instance)) if f.name in inline_form.fields}
                previous = stored(instance)
                before = snapshot(previous, names) if previous is not None else dict.fromkeys(names)
                pending.append(("save", instance, before, names))
        super().save_formset(request, form, formset, change)
        for kind, instance, before, extra in pending:
            if kind == AuditEntry.Action.ADMIN_DELETE:
                target_id, named = extra
                self.audit(request, kind, instance, target_id=target_id, named=named, before=before)
                continue
            saved = stored(instance)
            if saved is None:
                continue  # the admin's own save_formset chose not to keep it
            changes = diff(before, snapshot(saved, extra))
            if changes:
                added = all(value is None for value in before.values())
                self.audit(request, AuditEntry.Action.ADMIN_ADD if added else AuditEntry.Action.ADMIN_CHANGE, saved,
                           changes=changes)

    # --- history --------------------------------------------------------------------------------

    object_history_template = "admin/audited_object_history.html"
    HISTORY_ENTRIES = 100

    def history_view(self, request, object_id, extra_context=None):
        """Django's History page, with the project's audit entries about the object first: what
        admin actions, services and the API did to it (trial 14, F39: a job cancelled and
        re-classed through admin said "This object doesn't have a change history")."""
        from django.urls import reverse

        from .admin_audit_entries import visible_entries

        obj = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if obj is not None and self.has_view_or_change_permission(request, obj):
            target_type = type(obj).__name__.lower()  # as audit_prepare names a target
            entries = visible_entries(request, self.admin_site).filter(target_type=target_type,
                                                                       target_id=str(obj.pk))
            context.update(
                audit_entries=list(entries.select_related("actor")[:self.HISTORY_ENTRIES]),
                audit_count=entries.count(),
                audit_url=(reverse(f"{self.admin_site.name}:accounts_auditentry_changelist")
                           + f"?target_type={target_type}&target_id={obj.pk}"),
            )
        return super().history_view(request, object_id, extra_context=context)

    # --- actions ------------------------------------------------------------------------------

    def get_actions(self, request):
        actions = super().get_actions(request)
        return {name: (func if name == "delete_selected" else self._audited_action(func, name), name, description)
                for name, (func, _, description) in actions.items()}

    def _audited_action(self, func, name: str):
        @wraps(func)
        def run(modeladmin, request, queryset):
            # The rows before and after in one query each, their related rows with them (a snapshot
            # names them): read row by row, an action on 100 jobs made 300 queries before it did
            # anything, its confirmation page (cancel asks why) as many again (trial30b).
            related = [f.name for f in audited_fields(queryset.model) if f.is_relation and f.concrete
                       and not f.many_to_many]
            rows = [(obj, snapshot(obj)) for obj in queryset.select_related(*related)]
            latest = AuditEntry.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
            result = func(modeladmin, request, queryset)
            now = queryset.model._base_manager.select_related(*related).in_bulk([obj.pk for obj, _ in rows])
            # A row the action's service audited itself (model.promote, job.cancel, job.class …)
            # has its entry: a second, "admin.action", said the same thing again (manager trial 15, F8).
            recorded = {(entry.target_type, entry.target_id) for entry in AuditEntry.objects.filter(
                pk__gt=latest).exclude(action__startswith="admin.").only("target_type", "target_id")}
            for obj, before in rows:
                if (type(obj).__name__.lower(), str(obj.pk)) in recorded:
                    continue
                after = now.get(obj.pk)
                changes = diff(before, snapshot(after)) if after is not None else {}
                changes = {name: change for name, change in changes.items() if name not in BOOKKEEPING_FIELDS}
                if changes:  # an action that left a row alone is no change (trial 14, F1: `changes: {}`)
                    self.audit(request, AuditEntry.Action.ADMIN_ACTION, obj, action=name, changes=changes)
            return result

        return run


class AuditedAdminSite(admin.AdminSite):
    """The default admin site: every registered ModelAdmin gets :class:`AuditedModelAdmin` and
    :class:`~apps.core.admin_scoping.LookupsChecked` (no 500 on a lookup no id can be) in front."""

    def register(self, model_or_iterable, admin_class=None, **options):
        admin_class = admin_class or admin.ModelAdmin
        mixins = tuple(m for m in (AuditedModelAdmin, LookupsChecked) if not issubclass(admin_class, m))
        if mixins:
            admin_class = type(admin_class.__name__, (*mixins, admin_class),
                               {"__module__": admin_class.__module__, "__doc__": admin_class.__doc__})
        return super().register(model_or_iterable, admin_class, **options)
