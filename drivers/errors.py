"""Driver errors: one branch of the ``CellcalError`` tree.

``DriverError``
    ``DriverInitError``      the device could not be opened or identified.
    ``DriverTimeoutError``   no (complete) answer in time; also a builtin ``TimeoutError``.
    ``ProtocolError``        bytes that do not parse: bad CRC, bad length, bad field. The
                             codec raises it per bad frame and carries on decoding.
    ``DeviceGoneError``      the link dropped (port closed, socket reset, bus silent).
    ``DeviceError``          the device answered with an error condition; ``code`` is the
                             device's code (a name), device-kind modules subclass it
                             (tracker: no target, beam broken, ...; CANopen: SDO abort).
"""

from __future__ import annotations

from cellcal.solver.errors import CellcalError

__all__ = [
    "DriverError",
    "DriverInitError",
    "DriverTimeoutError",
    "ProtocolError",
    "DeviceGoneError",
    "DeviceError",
]


class DriverError(CellcalError):
    """Something went wrong talking to a device."""


class DriverInitError(DriverError):
    """The device could not be opened, identified or configured."""


class DriverTimeoutError(DriverError, TimeoutError):
    """The device did not answer within the timeout."""


class ProtocolError(DriverError):
    """Bytes on the wire that do not form a valid message."""


class DeviceGoneError(DriverError):
    """The connection to the device was lost."""


class DeviceError(DriverError):
    """The device reported an error condition.

    Attributes
    ----------
    code : str
        The device's error code, by name.
    """

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code
