"""Cost model and discrete-event simulation of the four methods (``python -m scalesgd.costmodel``)."""
