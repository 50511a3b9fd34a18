import sys

from ktae.cli import main

sys.exit(main())
