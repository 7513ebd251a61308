"""Lists gpudeck's packages under their installed names (gpudeck.jobs.* from jobs/, …); the rest is pyproject.toml."""
from setuptools import find_packages, setup

TOP_LEVEL = ("jobs", "console", "themes")

setup(packages=["gpudeck"] + [f"gpudeck.{name}" for name in find_packages(include=[f"{top}*" for top in TOP_LEVEL])])
