# pip install ./python: no network and no build dependencies needed (setuptools only;
# without a pyproject.toml pip builds in the current environment).
from setuptools import setup

setup(
    name="muster",
    version="0.1.0",
    description="Python client of the muster distributed work coordinator (standard library only)",
    long_description=open(__import__("os").path.join(__import__("os").path.dirname(__file__),
                                                      "README.md")).read(),
    long_description_content_type="text/markdown",
    packages=["muster"],
    python_requires=">=3.9",
    extras_require={"torch": ["torch"]},
)
