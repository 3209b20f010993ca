import sys

from flashruntime.cli.dispatch import main

sys.exit(main())
