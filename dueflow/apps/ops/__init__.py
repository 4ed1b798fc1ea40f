"""Operator tools: replay, dead-letter inspection and redrive, queue control.

Each module is the I/O behind one group of ``dueflow`` commands (and the
status page's redrive button); the rules they follow (filters, header
rewrites, what may be redriven) are pure functions next to them.
"""
