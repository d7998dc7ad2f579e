"""Services: coordinate the database, the domain rules, SSH and the task queue."""
