"""`python -m analyses.cli ...` is `workbench ...`."""

import sys

from analyses.cli import main

if __name__ == "__main__":
    sys.exit(main())
