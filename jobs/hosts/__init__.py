"""Hosts: the local machine and remote boxes reached over SSH (config, agent, client)."""
