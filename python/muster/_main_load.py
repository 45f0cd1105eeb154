"""Which Pool owner's script a worker is loading, shared by ``muster.worker`` and
``muster.pool``: a worker runs as ``python3 -m muster.worker``, whose module is
``__main__``, not the ``muster.worker`` that ``muster.pool`` imports, so the two cannot
share a global of either.  ``script`` is the path while ``muster.worker._main_module``
runs the script, else None."""

script = None
