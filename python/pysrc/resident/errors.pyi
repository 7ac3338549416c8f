
__all__ = ['ResidentError', 'Unplaceable', 'Unauthenticated', 'PermissionDenied', 'SchedulerGone', 'BadInput']

class ResidentError(Exception):
    '''An error from the cluster or the SDK.

    ``str(error)`` is the Rust error\'s message, which says what was wrong and what to do;
    ``error.kind`` names the Rust error\'s variant (``"Timeout"``, ``"TaskFailed"``, ...).
    '''
    message: str
    kind: str
    def __init__(self, message: str, kind: str = 'ResidentError') -> None: ...

class Unplaceable(ResidentError):
    """The cluster has no room for the pool as asked (VRAM, GPUs, labels)."""
class Unauthenticated(ResidentError):
    """No token, or one the cluster does not know."""
class PermissionDenied(ResidentError):
    """The token is known, but its role does not allow the call."""
class SchedulerGone(ResidentError):
    """The scheduler cannot be reached, or stayed away past the reconnect timeout."""
class BadInput(ResidentError):
    """An argument, input file, URL or credential is wrong as given."""
