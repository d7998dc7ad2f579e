"""Views by feature: inventory, profiles, calibrations, launches, cleanups, accounts."""
