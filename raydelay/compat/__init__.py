"""Other systems' client APIs over raydelay: :mod:`raydelay.compat.pulsar`."""
