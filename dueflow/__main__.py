import sys

from dueflow.apps.cli.main import main

sys.exit(main())
