import sys

from lartpc.cli import main

sys.exit(main())
