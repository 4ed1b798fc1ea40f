"""dueflow.streams"""
