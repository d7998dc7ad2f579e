"""Forms by feature (inventory, profiles, launches, cleanups) and the fields they share."""
