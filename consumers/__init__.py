"""dueflow.consumers"""
