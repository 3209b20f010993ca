"""Running the user's command on this machine: ``submit`` and ``Run`` (``flash.submit``),
the guard that lets no attempt outlive its driver, and ``flash.run`` for a plan.
Importing this package loads nothing; ``flashruntime.sdk`` is the public path.
"""
