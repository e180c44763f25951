"""Local sandbox backend: bubblewrap + overlayfs + cgroups + rlimits (see ``backend``).

Import from the modules (``backend.LocalBackend``, ``config.LocalSandboxConfig``...): the
package itself imports nothing, so that loading the config stays cheap.
"""
