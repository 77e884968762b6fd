import sys

from labrun.cli import main

sys.exit(main())
