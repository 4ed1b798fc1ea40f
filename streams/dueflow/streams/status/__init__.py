"""dueflow.streams.status: the status view (faust app over outcomes) and the cluster reader."""
