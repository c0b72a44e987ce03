"""The Ray actor class of the ``hf`` rollout server: a shell over :class:`recipes.verl_ext.plugin.hf_server.HFServer`
in a module that imports neither torch nor verl.

Ray 2.60 loads an actor's class wherever a handle to the actor is unpickled. verl's request load balancer gets the
servers' handles, so with the server's own class it imported the plugin, hence verl and torch (4 CPU-s on 2 cores,
while verl starts its workers). With this shell, only the server's own process builds the real server: the shell's
``__init__`` imports it there. Every method of the server is here, delegated by name (``SERVER_METHODS``: Ray makes
an actor's methods from its class); the class keeps the server's name, so Ray's log prefix and process title stay
``HFServer``.
"""

from __future__ import annotations

from typing import Any

# HFServer's public methods (all async): a test checks this list against the class
SERVER_METHODS = (
    "generate",
    "update_weights",
    "set_global_steps",
    "get_state",
    "wake_up",
    "sleep",
    "abort_all_requests",
    "resume_generation",
    "clear_kv_cache",
    "release_kv_cache",
    "resume_kv_cache",
    "wait_for_requests_to_drain",
    "start_profile",
    "stop_profile",
)


class HFServer:
    """Token-in/token-out generation with an HF model (the plugin's ``HFServer``, built in this actor's process)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # lazy: torch, transformers and verl load in the server's process only, not in each holder of its handle
        from recipes.verl_ext.plugin.hf_server import HFServer as Server

        self._server = Server(*args, **kwargs)


def _delegate(name: str):
    async def method(self, *args: Any, **kwargs: Any) -> Any:
        return await getattr(self._server, name)(*args, **kwargs)

    method.__name__ = name
    method.__qualname__ = f"HFServer.{name}"
    method.__doc__ = f"The server's ``{name}``."
    return method


for _name in SERVER_METHODS:
    setattr(HFServer, _name, _delegate(_name))
