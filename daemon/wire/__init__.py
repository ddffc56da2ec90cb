"""The wire: ZeroMQ's server and client, the vocabulary's pieces behind ``cellcal.daemon.protocol``.

``cellcal.daemon.protocol`` is the one name every speaker imports (``protocol as P``); what
it says is defined here, by seam: :mod:`vocabulary` (topics, error codes, roles, states,
kinds, modes, devices, limits), :mod:`commands` (the command table and argument
validation), :mod:`codec` (msgpack, requests and replies, the envelope), :mod:`types` (the
bodies' and results' TypedDicts and their checkers). :mod:`zmq_server` is the transport,
:mod:`client` the client the command line and integrators use. The bodies themselves, and
every result's wire form, are built in ``cellcal.daemon.bodies``.
"""
