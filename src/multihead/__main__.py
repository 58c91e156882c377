import sys

from multihead.cli import main

sys.exit(main())
