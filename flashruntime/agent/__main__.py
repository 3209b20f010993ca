import sys

from flashruntime.agent.command import main

sys.exit(main())
