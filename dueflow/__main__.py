import sys

from dueflow.cli.main import main

sys.exit(main())
