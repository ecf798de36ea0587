"""ftbus stage services: each sub-package imports only ``shared``, never a sibling."""
