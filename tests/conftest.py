import os

# Tests run on CPU whatever the machine has; XLA's own thread pools are enough on 2 cores.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
