"""Host queue: the turns users' runs take on one host's model, and the one pace model that
estimates their waits: ``run_queue``, ``queue_ticket``, ``run_cost``."""

__all__ = ["run_queue", "run_cost"]
