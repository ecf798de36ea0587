"""Where candidate code runs: the runners (local, Docker, Kubernetes), the sandbox spec and the disk quota."""
