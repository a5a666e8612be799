"""What every system runs on: the handler runner (threads, or a child process), the
background loops, the work lease, the outage log and the parts the systems share."""
