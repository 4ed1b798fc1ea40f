"""dueflow.producers"""
