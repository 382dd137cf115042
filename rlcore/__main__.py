import sys

from rlcore.cli import main

sys.exit(main())
