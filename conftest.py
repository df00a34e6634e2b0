"""Repository-level conftest: lets the plugin's pytester tests find the package from a
checkout, and documents that the scaleguard plugin itself loads through its pytest11 entry
point (installed by ``pip install -e .``)."""

pytest_plugins = ["pytester"]
