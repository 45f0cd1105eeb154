# Fallback for pip/setuptools too old for pyproject.toml metadata (pip install ./python).
from setuptools import setup

setup(name="muster", version="0.1.0", packages=["muster"], python_requires=">=3.9")
