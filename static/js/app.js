// Rankwise keeps JavaScript to a minimum: htmx does the work.
