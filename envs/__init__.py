"""sao-harness: envs — Docker engine, images without a registry, hardened sandboxes.

Modules (one job each): ``engine`` (find or start dockerd), ``hostpkg`` (Debian packages on the
host), ``mirror`` (the host apt's Debian mirror), ``images`` (debootstrap base image, offline wheel
builds, save/load cache), ``labels`` (run labels, owner liveness), ``shell`` (persistent bash over
an exec socket), ``sandbox`` (the hardened container), ``gc`` (leftovers), ``faults`` /
``errors`` (typed faults), ``config`` (``docker.*`` and ``sandbox.*``), ``cli`` (``sao docker``,
``sao sandbox``).
"""
