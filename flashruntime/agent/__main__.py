import sys

from flashruntime.agent.worker_cli import main

sys.exit(main())
