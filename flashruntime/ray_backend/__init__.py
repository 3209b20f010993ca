"""Running work on a Ray cluster the user already has.

- ``cluster``: the address forms (``local``, ``auto``, ``ray://host:port``, ``host:port``), the
  connection, and where a Ray task runs; Ray is imported inside functions only, when asked for.
- ``resources``: a task's placement gates as Ray resources, or why Ray cannot honour them.
- ``failures``: what Ray reported about a lost attempt, in the recovery taxonomy.
- ``launcher``: ``flash.submit(executor="ray")``: each attempt of a local run as one Ray task.

The coordinator's side (``flashruntime.coordinator.ray_dispatch``) and what runs in the Ray
worker for a coordinator task (``flashruntime.agent.ray_task``) live with their programs.
"""
