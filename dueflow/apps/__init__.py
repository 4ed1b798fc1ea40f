"""dueflow's applications: the command line (cli) and the operator tools (ops) it drives."""
