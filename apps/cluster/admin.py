from django.contrib import admin

from .models import GPU, Node


class GPUInline(admin.TabularInline):
    model = GPU
    extra = 0
    readonly_fields = ["index", "uuid", "model", "memory_mb", "memory_used_mb", "utilization", "simulated"]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "state", "simulated", "cpu_count", "memory_mb", "last_heartbeat"]
    list_filter = ["state", "simulated"]
    inlines = [GPUInline]
    actions = ["drain", "resume"]

    @admin.action(description="Drain: run what they have, start nothing new")
    def drain(self, request, queryset):
        queryset.filter(state=Node.State.ACTIVE).update(state=Node.State.DRAINING)

    @admin.action(description="Resume: accept new jobs")
    def resume(self, request, queryset):
        queryset.filter(state=Node.State.DRAINING).update(state=Node.State.ACTIVE)


@admin.register(GPU)
class GPUAdmin(admin.ModelAdmin):
    list_display = ["__str__", "memory_mb", "memory_used_mb", "utilization", "simulated"]
