# A portion of the dueflow namespace (pkgutil style): the package itself is
# dueflow/__init__.py, which every portion defers to; tools that read files
# (pyright, IDEs) see through this line to the other portions.
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
