"""The console's screens: one per view (dashboard, jobs…) plus modal helpers such as help."""
