"""``python -m dueflow.demo``."""

import sys

from dueflow.demo.run import main

sys.exit(main())
