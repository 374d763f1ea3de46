import sys

from tierfsd.main import main

sys.exit(main())
