"""NVLink multicast stays off: NCCL's NVLS algorithms, torch symmetric memory's multicast object and
NVSHMEM's NVLS are all disabled through the environment before anything initialises them.

hotpath never uses multicast (the deployments it targets must not depend on it), so a user who set
one of these to enable it gets a warning and the disabling value anyway.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

# variable -> the value that disables multicast
NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def disable_multicast(environ: dict[str, str] | None = None) -> None:
    """Sets NO_MULTICAST in `environ` (os.environ by default); call before NCCL or symmetric
    memory initialise (they read these once). A different value the user set is overridden, with
    a warning."""
    environ = os.environ if environ is None else environ
    for name, value in NO_MULTICAST.items():
        previous = environ.get(name)
        if previous is not None and previous.strip() != value:
            log.warning("%s=%s would enable NVLink multicast, which hotpath never uses: setting %s=%s",
                        name, previous, name, value)
        environ[name] = value
