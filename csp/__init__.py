"""infermax.csp."""
