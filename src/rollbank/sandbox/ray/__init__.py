"""Ray sandbox backend: the local bubblewrap backend hosted by one Ray actor per CPU node.

Import from the modules (``backend.RaySandboxBackend``, ``config.RaySandboxConfig``...): the
package itself imports nothing (and nothing here imports ray at module level), so rollbank
loads without the ``ray`` extra and loading the config stays cheap.
"""
