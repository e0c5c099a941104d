"""The host benches (`drumsd bench`, `drumsd bench episodes`), outside the daemon's layers.

`runtime` measures the Linux runtime on restored desktops (create, reset, fork, step, memory);
`episodes` runs whole scripted episodes through the API on each feature path; `screenshots` times
the screenshot path. They drive the daemon's layers from outside and nothing in the daemon imports
them.
"""
