"""Integrations: rollbank behind other tools' seams (the top of the layer map, beside cli).

Each integration imports its tool only inside its own subpackage, so rollbank itself never
needs it installed.
"""
