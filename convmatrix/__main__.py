import sys

from convmatrix.cli import main

sys.exit(main())
