from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.template.response import TemplateResponse

from apps.core.admin_scoping import ChangedFieldsSaveAdmin, GuardedDeleteAdmin, SuperuserEditAdmin

from .models import GPU, Node
from .services import node_delete, node_delete_refusal, node_drain, node_resume


def every_field(model) -> list[str]:
    return [f.name for f in model._meta.concrete_fields if f.name != "id"]


class GPUInline(SuperuserEditAdmin, admin.TabularInline):
    """A node's GPUs as its worker last reported them: nobody edits, adds or removes them here
    (the next registration would undo it; trial 14, F6)."""

    model = GPU
    extra = 0
    readonly_fields = ["index", "uuid", "model", "memory_mb", "memory_used_mb", "utilization", "simulated"]
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


class DrainForm(forms.Form):
    reason = forms.CharField(max_length=200, help_text="why: shown to the users whose jobs wait for these nodes")


# Nodes are shared by every team: managers may look, only admins drain or resume them.
@admin.register(Node)
class NodeAdmin(GuardedDeleteAdmin, SuperuserEditAdmin, ChangedFieldsSaveAdmin, admin.ModelAdmin):
    list_display = ["name", "state", "drain_reason", "storage_problem", "simulated", "cpu_count", "memory_mb", "last_heartbeat"]
    list_filter = ["state", "simulated"]
    inlines = [GPUInline]
    actions = ["drain", "evacuate", "resume"]

    # Every field is the worker's (registration and heartbeats) or the drain actions': an edit
    # here was undone at the next registration, or lied (a "lost" node that reports, a drain with
    # no reason; trial 14, F6). The change page shows them; the actions change the state.
    def get_readonly_fields(self, request, obj=None):
        return every_field(Node)

    def has_add_permission(self, request, *args):
        return False  # a node is registered by its worker (manage.py gpu_worker, slurm_agent)

    # Deleting a live node, or one holding jobs, strands them (trial 14, F28): refused with the
    # reason, on its own delete page and in the bulk "delete selected" action alike.
    def delete_refusal(self, obj) -> str | None:
        return node_delete_refusal(obj)

    def delete_model(self, request, obj):
        node_delete(node=obj)

    def delete_queryset(self, request, queryset):
        for node in queryset:
            node_delete(node=node)

    @admin.action(description="Drain: run what they have, start nothing new (asks why)", permissions=["change"])
    def drain(self, request, queryset):
        return self.drain_asking(request, queryset, evacuate=False)

    @admin.action(description="Drain and requeue their running jobs (they resume from their checkpoint; asks why)",
                  permissions=["change"])
    def evacuate(self, request, queryset):
        return self.drain_asking(request, queryset, evacuate=True)

    @admin.action(description="Resume: accept new jobs", permissions=["change"])
    def resume(self, request, queryset):
        chosen = list(queryset)
        moved = [node.name for node in chosen if node_resume(node=node)]
        if moved:
            self.message_user(request, f"{len(moved)} node(s) active again: they accept new jobs ({', '.join(moved)})",
                              messages.SUCCESS)
        skipped = [f"{node.name} ({node.state})" for node in chosen if node.name not in moved]
        if skipped:
            self.message_user(request, f"not changed, not draining: {', '.join(skipped)}", messages.WARNING)

    def drain_asking(self, request, queryset, *, evacuate: bool):
        """First a page that asks why (and, to evacuate, lists the jobs that will be requeued),
        then the drain itself once the reason is given (trial 14, F6)."""
        form = DrainForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            self.drain_apply(request, list(queryset), reason=form.cleaned_data["reason"], evacuate=evacuate)
            return None
        from apps.jobs.models import HOLDING_STATES, Job

        running = Job.objects.filter(node__in=queryset, state__in=HOLDING_STATES, is_sweep=False).select_related(
            "node", "team", "user")
        context = {
            **self.admin_site.each_context(request),
            "title": "Drain and requeue running jobs" if evacuate else "Drain nodes",
            "opts": self.model._meta,
            "form": form,
            "nodes": list(queryset),
            "running": list(running) if evacuate else [],
            "evacuate": evacuate,
            "action": "evacuate" if evacuate else "drain",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/cluster/node/drain.html", context)

    def drain_apply(self, request, nodes: list[Node], *, reason: str, evacuate: bool) -> None:
        from apps.jobs.models import HOLDING_STATES
        from apps.jobs.services import job_evacuate

        drained, requeued, skipped = [], [], []
        for node in nodes:
            if node.state not in (Node.State.ACTIVE, Node.State.DRAINING):
                why = ("the lost-node reaper requeues what it held" if node.state == Node.State.LOST
                       else "its worker is stopping")
                skipped.append(f"{node.name} ({node.state}: {why})")
                continue
            if node_drain(node=node, reason=reason):
                drained.append(node.name)
            elif not evacuate:
                skipped.append(f"{node.name} (already draining: {node.drain_reason})")
            if evacuate:
                for job in node.jobs.filter(state__in=HOLDING_STATES, is_sweep=False).select_related("team"):
                    if job_evacuate(job, node_name=node.name, reason=reason, by=request.user):
                        requeued.append(job.task_name)
                    else:
                        skipped.append(f"job {job.task_name} (being cancelled, or it ended meanwhile): not requeued")
        if drained:
            self.message_user(request, f"{len(drained)} node(s) draining: they run what they have and start "
                                       f"nothing new ({', '.join(drained)}; reason: {reason})", messages.SUCCESS)
        if evacuate:
            self.message_user(request, f"{len(requeued)} job(s) requeued: they stop at their next epoch end and "
                                       f"resume from their checkpoint elsewhere"
                                       + (f" ({', '.join(requeued)})" if requeued else ""), messages.SUCCESS)
        if skipped:
            self.message_user(request, f"not changed: {'; '.join(skipped)}", messages.WARNING)


@admin.register(GPU)
class GPUAdmin(SuperuserEditAdmin, admin.ModelAdmin):
    """What the workers report: read-only for everyone (trial 14, F6)."""

    list_display = ["__str__", "memory_mb", "memory_used_mb", "utilization", "simulated"]

    def get_readonly_fields(self, request, obj=None):
        return every_field(GPU)

    def has_add_permission(self, request, *args):
        return False
