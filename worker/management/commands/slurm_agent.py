"""manage.py slurm_agent --partition P: run the portal's attempts on a partition of an existing
Slurm cluster (worker/executors/slurm.py). Runs where sbatch/squeue/scancel work (SLURM_CONF,
munge), with the portal's database; the Slurm nodes get neither."""

from __future__ import annotations

import logging
import signal
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from worker.artifacts import shared_storage_problem
from worker.executors.slurm import SlurmAgent
from yoloportal.logs import bind

log = logging.getLogger("yoloportal.slurm")


class Command(BaseCommand):
    help = "Register a Slurm partition's nodes and run the portal's attempts on them (sbatch/squeue/scancel)."

    def add_arguments(self, parser):
        parser.add_argument("--partition", default=settings.SLURM_PARTITION,
                            help="the Slurm partition that is this node pool (default SLURM_PARTITION)")

    def handle(self, *args, partition: str, **options):
        if not partition:
            raise CommandError("give --partition (or set SLURM_PARTITION)")
        SlurmAgent.portal_url()  # fails early without SLURM_PORTAL_URL
        bind(component="slurm_agent")
        # Inputs and results go through the shared filesystem at the same paths on the Slurm nodes:
        # an agent on a machine without it registered the partition, whose jobs all failed there.
        if problem := shared_storage_problem():
            raise CommandError(f"slurm_agent for partition {partition} not started: {problem}")
        agent = SlurmAgent(partition)
        self.stopping = False
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        agent.sync_nodes(force=True)
        self.stdout.write(f"slurm_agent: partition {partition}, portal {SlurmAgent.portal_url()}")
        while not self.stopping:
            try:
                agent.tick()
            except Exception:  # noqa: BLE001 - keep the agent alive through a database blip
                log.exception("slurm_agent pass failed")
            time.sleep(settings.SLURM_POLL_S)

    def stop(self, *_args) -> None:
        self.stopping = True
