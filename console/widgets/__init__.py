"""Textual widgets of the console: panels and panes that render core snapshots."""
